"""Browser fixtures: the real app under `streamlit run` on a free port, and Debian's chromium.

Both are session-scoped: one server and one browser for every end-to-end test. Tests that
use them skip cleanly where /usr/bin/chromium is missing. A test that needs a server of its own
(another environment or other options) starts one with :func:`serve_app`.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"streamlit exited with code {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError(f"streamlit did not answer {url}/_stcore/health within {timeout:.0f} s")


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"needs Debian's chromium at {CHROMIUM}")
    pytest.importorskip("playwright.sync_api")
    return CHROMIUM


@dataclass(frozen=True)
class Server:
    """A running `streamlit run app.py`: its base URL and process id."""

    url: str
    pid: int


@contextmanager
def serve_app(log: Path, env: dict[str, str] | None = None, options: Sequence[str] = (),
              timeout: float = 120) -> Iterator[Server]:
    """`streamlit run app.py` on a free port of 127.0.0.1 until the block ends.

    Args:
        log: file that receives the server's output.
        env: the server's environment (this process's when None).
        options: more ``streamlit run`` options, e.g. ``["--server.disconnectedSessionTTL", "2"]``.
        timeout: seconds to wait for ``/_stcore/health``.
    """
    port = _free_port()
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port),
             "--server.headless", "true", "--server.address", "127.0.0.1",
             "--browser.gatherUsageStats", "false", *options],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_healthy(url, proc, timeout=timeout)
            yield Server(url, proc.pid)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture(scope="session")
def app_url(chromium_path) -> str:
    """`streamlit run app.py` on a free port; yields its base URL, stops it afterwards."""
    with serve_app(ARTIFACTS / "streamlit.log") as server:
        yield server.url


@pytest.fixture(scope="session")
def chromium(chromium_path):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def wait_for_app():
    """The function that waits for a Streamlit script run to finish: ``wait_for_app(page)``."""
    return _wait_for_app


def _wait_for_app(page, timeout: float = 120) -> None:
    """Wait until the script run is over: the app root says ``notRunning`` for a whole second."""
    page.wait_for_selector('[data-testid="stApp"]', timeout=timeout * 1000)
    deadline = time.monotonic() + timeout
    quiet_since = None
    while time.monotonic() < deadline:
        state = page.locator('[data-testid="stApp"]').first.get_attribute("data-test-script-state")
        if state != "notRunning":
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 1.0:
            return
        page.wait_for_timeout(150)
    raise AssertionError(f"the app was still running after {timeout:.0f} s")
