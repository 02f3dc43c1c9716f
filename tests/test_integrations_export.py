"""Tracker exports: the watch's numbers and findings in TensorBoard, read back from its event files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from inspector import InspectorError, read_run, watch
from inspector.integrations import RunFollower, TensorBoardExport
from tests.watched_loop import loop

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def scalars(logdir) -> dict[str, list[tuple[int, float]]]:
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}, acc


def test_tensorboard_gets_every_step_and_every_finding(tmp_path):
    run = loop(tmp_path, [TensorBoardExport(logdir=tmp_path / "tb")], poison=2)
    got, acc = scalars(tmp_path / "tb")
    steps = run.steps
    assert [s for s, _ in got["inspector/grad_norm"]] == [0, 1]  # steps 2 and 3 have NaN norms: not drawn
    np.testing.assert_allclose([v for _, v in got["inspector/grad_norm"]], steps.grad_norm[:2], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in got["inspector/loss"]][:2], steps.loss[:2], rtol=1e-6)
    assert [v for _, v in got["inspector/nonfinite"]] == steps.nonfinite.tolist()
    _, grads = run.matrix("grad_norm")  # steps x modules ("0", "2")
    np.testing.assert_allclose([v for _, v in got["inspector/grad_norm/0"]], grads[:2, 0], rtol=1e-6)
    assert "inspector/update_ratio/2" in got
    # per-module nonfinite counts only on the steps that had any: 2 (the Inf input) and 3
    assert [s for s, _ in got["inspector/nonfinite/0"]] == steps.step[steps.nonfinite > 0].tolist() == [2, 3]
    tag = "inspector/findings/text_summary"
    assert tag in acc.Tags()["tensors"]
    shown = [bytes(e.tensor_proto.string_val[0]).decode() for e in acc.Tensors(tag)]
    first = run.findings[0]
    assert any(f"step {first.step}" in t and first.code in t and first.where in t for t in shown)


def test_a_given_summary_writer_is_flushed_not_closed(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(tmp_path / "own"))
    loop(tmp_path, [TensorBoardExport(writer, depth=0)], steps=2)
    writer.add_scalar("mine", 1.0, 0)  # still open: the user's writer stays theirs
    writer.close()
    got, _ = scalars(tmp_path / "own")
    assert "inspector/grad_norm" in got and "mine" in got
    assert not [t for t in got if t.startswith("inspector/grad_norm/")]  # depth 0: no module lines


def test_unknown_export_is_refused_with_the_choices(tmp_path):
    with pytest.raises(InspectorError, match="tensorboard:<logdir>"):
        loop(tmp_path, ["tensorbored"], steps=1)


def test_follower_reads_each_step_once_while_the_file_grows(tmp_path):
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    follower = RunFollower(tmp_path / "f.inspect")
    seen = []
    with watch(model, opt, tmp_path / "f.inspect") as w:
        for step in range(5):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
            opt.zero_grad()
            if step < 3:
                w.flush()  # steps 3 and 4 stay held (at most 0.5 s) until the block ends
            seen.append([r.step for r in follower.new_rows()])
    seen.append([r.step for r in follower.new_rows()])  # the held steps, then the end-of-stream marker
    assert seen[:3] == [[0], [1], [2]] and sum(seen[3:], []) == [3, 4]
    # d(sum(Wx+b))/dW = x = (1, 1), d/db = 1: the gradient norm is sqrt(3) at every step
    assert follower.meta is not None and follower.meta.modules == ("",)


def test_importing_the_integrations_loads_no_training_stack():
    import subprocess
    import sys

    code = ("import sys, inspector.integrations as i; "
            "print(sorted(m for m in ('transformers', 'pytorch_lightning', 'tensorboard', 'wandb', 'mlflow') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_export_of_its_own_logdir_serves_a_second_run(tmp_path):
    export = TensorBoardExport(logdir=tmp_path / "tb")
    loop(tmp_path, [export], steps=2)
    export.step_offset = 2  # the second run continues the x axis
    loop(tmp_path, [export], steps=2)
    got, _ = scalars(tmp_path / "tb")
    assert [s for s, _ in got["inspector/grad_norm"]] == [0, 1, 2, 3]


def test_a_script_that_dies_still_closes_its_run_file(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "train.py"
    script.write_text(
        "import sys, torch\n"
        "from torch import nn\n"
        "from inspector.integrations import WatchedTraining\n"
        "m = nn.Linear(2, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "WatchedTraining(sys.argv[1], report=None).start(m, opt)\n"
        "m(torch.ones(1, 2)).sum().backward(); opt.step()\n"
        "raise RuntimeError('the loader broke')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "r.inspect")], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 1 and "the loader broke" in out.stderr
    run = read_run(tmp_path / "r.inspect")
    assert len(run.steps) == 1  # closed at exit: every step and the exception that ended the program
    assert not run.complete and "RuntimeError: the loader broke" in run.failure.message
