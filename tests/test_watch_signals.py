"""A watched run ended by SIGTERM (torchrun, a scheduler, ``kill``) is recorded before it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from torch import nn

from inspector import read_run, watch

ROOT = Path(__file__).resolve().parents[1]

LOOP = textwrap.dedent("""
    import os, signal, sys, torch
    from torch import nn
    from inspector import watch
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if sys.argv[2] == "own":  # the program's own handler: it checkpoints and exits cleanly
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    with watch(model, opt, sys.argv[1]) as w:
        for i in range(10):
            if i == 3:
                os.kill(os.getpid(), signal.SIGTERM)
            model(torch.ones(2, 4)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
""")


def _run(tmp_path: Path, handler: str) -> tuple[int, object]:
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    path = tmp_path / "run.inspect"
    done = subprocess.run([sys.executable, str(script), str(path), handler], cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)
    return done.returncode, read_run(path)


def test_sigterm_is_recorded_as_run_failed_and_the_process_ends_as_the_signal_would(tmp_path):
    code, run = _run(tmp_path, "default")
    assert code == -signal.SIGTERM  # ended by the signal itself, as without the watch
    assert len(run.steps) == 3
    assert [(f.step, f.code) for f in run.findings] == [(3, "run-failed")]
    assert "SIGTERM" in run.findings[0].message


def test_a_programs_own_sigterm_handler_is_left_alone(tmp_path):
    code, run = _run(tmp_path, "own")
    assert code == 0  # the program's handler ran: sys.exit(0) ends the block, not a signal
    assert [f.code for f in run.findings] == ["run-failed"]  # SystemExit(0) leaves the block early
    assert "SIGTERM" not in run.findings[0].message


def test_the_handler_is_put_back_when_the_watch_ends(tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "run.inspect"):
        assert signal.getsignal(signal.SIGTERM) is not before
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
    assert signal.getsignal(signal.SIGTERM) is before
