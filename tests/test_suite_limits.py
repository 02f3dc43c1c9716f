"""No test can wait longer than its timeout: a test stuck in C++ with the GIL held, and a test that
starts collectives and never returns, each end in bounded time and print every thread's stack."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STUCK = '''
import re
import time

import pytest


@pytest.mark.timeout(2)
def test_holds_the_gil():
    re.match(r"(a+)+$", "a" * 64 + "b")  # backtracks for hours inside C, never letting go of the GIL


@pytest.mark.collectives
def test_never_returns():
    time.sleep(3600)
'''


def _pytest(folder: Path, test: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    """``test`` of STUCK run by a pytest that loads the suite's conftest, with the suite's settings."""
    (folder / "test_stuck.py").write_text(STUCK)
    cmd = [sys.executable, "-m", "pytest", f"test_stuck.py::{test}", "-p", "tests.conftest", "-q",
           "-p", "no:cacheprovider", "--rootdir", str(folder), "-o", "timeout_method=thread",
           "-o", "timeout=600"]
    start = time.monotonic()
    done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    return done, time.monotonic() - start


def test_a_test_stuck_in_cpp_with_the_gil_held_ends_with_every_stack(tmp_path):
    done, seconds = _pytest(tmp_path, "test_holds_the_gil", INSPECTOR_TEST_HARD_GRACE="2")
    assert done.returncode != 0
    assert seconds < 60  # 2 s of timeout, 2 s of grace, and a pytest start
    out = done.stdout + done.stderr
    assert "Thread 0x" in out and 'test_stuck.py", line 10 in test_holds_the_gil' in out


def test_a_collectives_test_that_never_returns_is_ended_by_its_parent(tmp_path):
    done, seconds = _pytest(tmp_path, "test_never_returns", INSPECTOR_TEST_COLLECTIVES_TIMEOUT="8")
    assert done.returncode == 1
    assert seconds < 60
    assert "test_never_returns did not finish in 8 s; every thread's stack" in done.stdout
    assert 'test_stuck.py", line 15 in test_never_returns' in done.stdout  # the child's own stack
