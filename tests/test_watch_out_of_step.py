"""Two gloo ranks under DDP and the watch: a rank that falls out of step is named at its next check-in,
before anyone blocks in a collective, and the run file says which rank and what it skipped; a healthy
run is silent; a rank that joins late or watches another model is named, never a hang."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from ranks import init, spawn_ranks
from torch import nn

TIMEOUT = 5.0  # the watch's timeout in these runs: every case ends well within a minute
CASES = ("healthy", "batch", "step", "model", "late", "forward")  # "forward" leaves a collective hanging


def _net(wide: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)]
    return nn.Sequential(*layers, *([nn.Linear(1, 1)] if wide else []))


def _case(case: str, rank: int, out: Path) -> None:
    from inspector import watch

    if case == "model":  # rank 1's model has one more layer (DDP would refuse it: a plain model)
        model = _net(wide=rank == 1)
    else:
        model = nn.parallel.DistributedDataParallel(_net())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if case == "late" and rank == 1:
        time.sleep(TIMEOUT + 2)  # rank 1 opens its watch after rank 0's timeout passed
    with watch(model, opt, out / f"{case}.inspect", timeout=TIMEOUT):
        for step in range(4):
            odd = rank == 1 and step == 1
            if case == "healthy":  # two micro-batches a step, and an evaluation on rank 0 alone: in step
                with model.no_sync():
                    model(torch.ones(2, 4)).pow(2).mean().backward()
                if rank == 0:
                    with torch.no_grad():
                        model(torch.ones(2, 4))
            if case == "batch" and odd:
                continue  # rank 1 skips a batch: no forward pass, no step
            loss = model(torch.full((2, 4), float(step + 1))).pow(2).mean()
            if case == "forward" and odd:
                continue  # rank 1 skips the batch after its forward pass (an exception caught there)
            loss.backward()
            if not (case == "step" and odd):  # rank 1 skips optimizer.step()
                opt.step()
            opt.zero_grad()


def _worker(rank: int, world: int, port: int, out: str) -> None:
    from inspector.distributed import end_group

    torch.set_num_threads(1)
    err = open(Path(out) / f"stderr{rank}.txt", "w")  # what c10d and gloo print, for the test to read
    os.dup2(err.fileno(), 2)
    init(rank, world, port)
    said: dict[str, dict] = {}
    try:
        for case in CASES:
            began = time.monotonic()
            try:
                _case(case, rank, Path(out))
                text = ""
            except Exception as exc:  # noqa: BLE001 - the test reads what each rank was told
                text = f"{type(exc).__name__}: {exc}"
            said[case] = {"said": text, "seconds": time.monotonic() - began}
            (Path(out) / f"said{rank}.json").write_text(json.dumps(said))
    finally:
        end_group(wait=False)  # after the last case, the other rank is out of step: no barrier with it
        err.close()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("out_of_step")
    began = time.monotonic()
    spawn_ranks(_worker, 2, str(out), timeout=180)
    said = [json.loads((out / f"said{r}.json").read_text()) for r in (0, 1)]
    return out, said, time.monotonic() - began


def _failure(out: Path, case: str):
    from inspector import read_run

    run = read_run(out / f"{case}.inspect")
    assert not run.complete, case
    return run.failure


def test_a_healthy_ddp_run_is_silent(runs):
    from inspector import read_run

    out, said, _ = runs
    run = read_run(out / "healthy.inspect")
    assert run.complete and run.failure is None
    assert [f.code for f in run.findings] == []
    assert sorted(set(run.steps["step"])) == [0, 1, 2, 3]
    assert said[0]["healthy"]["said"] == said[1]["healthy"]["said"] == ""


def test_a_skipped_batch_is_named_with_its_rank(runs):
    out, said, _ = runs
    f = _failure(out, "batch")
    assert f.rank == 1 and f.code == "run-failed"
    assert "rank 1 left the watch after 3 step(s) and 3 training forward pass(es)" in f.message
    assert "rank 1 skipped a batch" in f.message
    assert "rank 1 skipped a batch" in said[0]["batch"]["said"]  # rank 0 stopped before its forward pass
    assert said[0]["batch"]["seconds"] < TIMEOUT  # at once: rank 1 had left


def test_a_skipped_optimizer_step_is_named_at_once_on_both_ranks(runs):
    out, said, _ = runs
    f = _failure(out, "step")
    assert f.rank == 1 and "rank 1 skipped optimizer.step() (or w.step()) at step 1" in f.message
    for r in (0, 1):
        assert "rank 1 skipped optimizer.step()" in said[r]["step"]["said"], r
        assert said[r]["step"]["seconds"] < TIMEOUT, r  # no rank waited out the timeout


def test_an_extra_forward_pass_is_named_when_the_other_rank_waits_in_ddps_all_reduce(runs):
    out, said, _ = runs
    f = _failure(out, "forward")
    assert f.rank == 1 and "rank 1 ran an extra training forward pass" in f.message
    assert "DDP's gradient all-reduce" in f.message
    assert "rank 1 ran an extra training forward pass" in said[1]["forward"]["said"]
    assert TIMEOUT <= said[1]["forward"]["seconds"] < TIMEOUT + 10  # named when the timeout passed
    assert said[0]["forward"]["said"]  # rank 0's all-reduce ended with rank 1's group: no hang


def test_a_rank_that_joins_late_is_named_and_nobody_hangs(runs):
    out, said, _ = runs
    f = _failure(out, "late")
    assert f.rank == 1 and f"rank 1 made no check-in within {TIMEOUT:g} s" in f.message
    assert "joined late" in f.message
    assert TIMEOUT <= said[0]["late"]["seconds"] < TIMEOUT + 10
    assert "rank 1 made no check-in" in said[1]["late"]["said"]  # the late rank is told the same, at once


def test_a_rank_with_another_model_is_named(runs):
    out, said, _ = runs
    f = _failure(out, "model")
    assert f.rank == 1 and "rank 1 watches another model than rank 0" in f.message
    # rank 0: Linear(4, 8) 40 elements and Linear(8, 1) 9; rank 1 adds Linear(1, 1), 2 more
    assert "6 trainable parameters of 51 elements against 4 trainable parameters of 49 elements" in f.message
    for r in (0, 1):
        assert "rank 1 watches another model" in said[r]["model"]["said"]


def test_waiting_prints_no_c10d_lines_and_the_cases_end_within_a_minute(runs):
    out, said, seconds = runs
    text = (out / "stderr0.txt").read_text()
    assert "waitForInput" not in text and "timed out after" not in text, text[-2000:]
    assert all(said[r][c]["seconds"] < 30 for r in (0, 1) for c in CASES), said
