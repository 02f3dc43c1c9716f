"""Every ``python`` and ``bash`` code block of README.md and docs/ runs as written, so a snippet that
fails as written fails here.

A block runs in a folder of its own (the current directory; ``HOME`` there too), after the setup that the
HTML comment above its fence names, which makes what the snippet takes as given (``model``,
``optimizer``, a run file...):

- ``<!-- docs-test: with SETUP -->``: run after ``SETUP`` (one of :data:`SETUPS`);
- ``<!-- docs-test: skip: REASON -->``: not run, for a reason that says why it cannot run here (a GPU,
  torchrun across processes or nodes, a download, a server that does not return). A skip without a
  reason, or an unknown marker, fails.

Python blocks run in this process (``exec``); a bash block whose every line is ``python -m inspector
...`` runs each command through ``main(argv)`` in this process, any other bash block under ``bash -e``.
Blocks without a language (diagrams, output) are text.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_MARK = re.compile(r"<!-- docs-test: (.*?) -->\s*$")
_INSPECTOR = re.compile(r"^(?:\.venv/bin/)?python -m inspector (.*)$")


def blocks() -> list:
    out = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for m in _BLOCK.finditer(text):
            lang, body = m.groups()
            if lang not in ("python", "bash"):
                continue
            before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = _MARK.search(before)
            line = text[:m.start()].count("\n") + 1
            mark = mark.group(1) if mark else ""
            group = [pytest.mark.collectives] if mark.removeprefix("with ") in COLLECTIVES else []
            out.append(pytest.param(lang, body, mark, id=f"{path.relative_to(ROOT)}:{line}", marks=group))
    return out


# The setups: each prepares the current folder and returns the names the snippet takes as given.

class Tiny(nn.Module):  # (B, 4) -> (B,); the loss is the mean square
    def __init__(self):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(4, 3), nn.Linear(3, 1)

    def forward(self, x):
        return self.lin2(torch.relu(self.lin1(x))).squeeze(-1)


def _loop() -> dict:
    torch.manual_seed(0)
    model = Tiny()
    return {"model": model, "optimizer": torch.optim.SGD(model.parameters(), lr=0.1),
            "loader": [torch.randn(2, 4) for _ in range(3)], "loss_fn": lambda out, batch: out.pow(2).mean()}


def _checkpoints() -> dict:
    from safetensors.torch import save_file

    from inspector import load_model

    model = load_model("sample:tiny-gpt2").model
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}  # tied to transformer.wte.weight: safetensors stores a tie once
    save_file(state, "base.safetensors")
    kept = ("transformer.wte", "transformer.wpe")
    save_file({k: v if k.startswith(kept) else v + 0.01 for k, v in state.items()}, "finetuned.safetensors")
    return {"base": "base.safetensors", "merged": "finetuned.safetensors"}


def _runs() -> dict:  # and what the page's earlier block imported
    from inspector import compare
    from inspector.watching import synthetic_run

    synthetic_run("run_a.inspect", steps=20, modules=4, seed=0)
    synthetic_run("run_b.inspect", steps=20, modules=4, seed=1)
    return {"compare": compare}


def _ddp() -> dict:
    names = _loop()

    def train(model):
        for batch in names["loader"]:
            names["loss_fn"](model(batch), batch).backward()

    return {"model": names["model"], "device": "cpu", "train": train}


def _check_run() -> dict:  # and read_run, which the page's earlier block imported
    from inspector import read_run
    from inspector.distributed import check_step

    names = _loop()
    for step, batch in enumerate(names["loader"] * 2):
        names["loss_fn"](names["model"](batch), batch).backward()
        for path in ("run.inspect", "check.inspect"):
            check_step(names["model"], step, path)
        names["optimizer"].step()
        names["optimizer"].zero_grad()
    return {"read_run": read_run}


def _watched_run() -> dict:
    from inspector.watching import synthetic_run

    synthetic_run("run.inspect", steps=130, modules=4)
    return {}


def _trainer() -> dict:
    from transformers import Trainer, TrainingArguments

    class Model(Tiny):
        def forward(self, x, labels=None):
            return {"loss": ((super().forward(x) - labels) ** 2).mean()}

    rows = [{"x": torch.randn(4), "labels": torch.tensor(float(i % 3))} for i in range(8)]
    args = TrainingArguments("out", per_device_train_batch_size=2, max_steps=4, use_cpu=True, report_to=[],
                             save_strategy="no", logging_steps=1)
    return {"trainer": Trainer(model=Model(), args=args, train_dataset=rows)}


def _lightning() -> dict:
    import pytorch_lightning as pl

    return {"pl": pl}


def _accelerate() -> dict:
    from types import SimpleNamespace

    from accelerate import Accelerator

    class Model(Tiny):
        def forward(self, x, labels):
            return SimpleNamespace(loss=((super().forward(x) - labels) ** 2).mean())

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = Model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = [{"x": torch.randn(2, 4), "labels": torch.zeros(2)} for _ in range(3)]
    model, optimizer = accelerator.prepare(model, optimizer)
    return {"accelerator": accelerator, "model": model, "optimizer": optimizer, "loader": loader}


COLLECTIVES = {"ddp"}  # setups whose snippet starts a process group: run in a child process (conftest)
SETUPS = {"loop": _loop, "checkpoints": _checkpoints, "runs": _runs, "ddp": _ddp, "check-run": _check_run,
          "watched-run": _watched_run, "trainer": _trainer, "lightning": _lightning,
          "accelerate": _accelerate}


def _inspector_lines(body: str) -> list[list[str]] | None:
    """Each line's arguments when every line is ``python -m inspector ...`` (comments dropped), else None."""
    out = []
    for line in body.splitlines():
        words = shlex.split(line, comments=True)
        if not words:
            continue
        m = _INSPECTOR.match(shlex.join(words))
        if m is None:
            return None
        out.append(shlex.split(m.group(1)))
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("lang, body, mark", blocks())
def test_the_code_block_runs_as_written(lang, body, mark, tmp_path, monkeypatch):
    setup = {}
    if mark.startswith("skip:") and mark.removeprefix("skip:").strip():
        pytest.skip(mark.removeprefix("skip:").strip())
    assert not mark or mark.startswith("with "), f"unknown marker {mark!r} (skip: REASON, or with SETUP)"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("sample_models", "docs", ".venv"):
        (tmp_path / name).symlink_to(ROOT / name)
    if mark:
        assert mark.removeprefix("with ") in SETUPS, f"no setup named {mark!r}"
        setup = SETUPS[mark.removeprefix("with ")]()
    if lang == "python":
        np.random.seed(0)
        exec(compile(body, "<docs block>", "exec"), {"__name__": "__docs__", **setup})  # noqa: S102
        return
    commands = _inspector_lines(body)
    if commands is not None:
        from inspector.__main__ import main

        for argv in commands:
            assert main(argv) == 0, argv
        return
    env = dict(os.environ, HOME=str(tmp_path), PYTHONPATH=str(ROOT),
               PATH=f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}")
    done = subprocess.run(["bash", "-e", "-c", body], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_marker_is_known():
    marks = [p.values[2] for p in blocks() if p.values[2]]
    for mark in marks:
        assert (mark.startswith("skip:") and mark.removeprefix("skip:").strip()) or \
            mark.removeprefix("with ") in SETUPS, mark
