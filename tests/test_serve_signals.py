"""``serve`` never leaves a streamlit server behind: a SIGTERM to it (docker stop, systemd, a test's
``terminate()``) stops the server too. (Killing ``serve`` outright, SIGKILL, stops it as well through
the kernel's parent-death signal; that costs another server start, ~10 s, so it is not run here.)"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the death signal is Linux's")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(port: int, log) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "inspector", "serve", "--port", str(port),
                             "--server.address", "127.0.0.1", "--server.headless", "true",
                             "--browser.gatherUsageStats", "false"],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def _children(proc: subprocess.Popen, timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        found = psutil.Process(proc.pid).children(recursive=True)
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError("serve started no server")


def _healthy(port: int, proc: subprocess.Popen, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            time.sleep(0.3)
    return False


def _gone(children: list[psutil.Process]) -> bool:
    _, alive = psutil.wait_procs(children, timeout=30)
    for p in alive:  # do not leave them behind even when the test fails
        p.kill()
    return not alive


def test_a_sigterm_to_serve_stops_the_streamlit_server(tmp_path):
    port = _free_port()
    with open(tmp_path / "serve.log", "w") as log:
        proc = _serve(port, log)
        try:
            children = _children(proc, timeout=60)
            assert _healthy(port, proc, timeout=90), (tmp_path / "serve.log").read_text()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert _gone(children), (tmp_path / "serve.log").read_text()
    assert proc.returncode == 0  # streamlit stops cleanly on SIGTERM, and serve returns its status
