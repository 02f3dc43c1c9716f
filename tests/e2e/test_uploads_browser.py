"""An uploaded checkpoint lives as long as its browser session: a real server, a real upload,
the tab closed, and the session's folder gone once Streamlit forgets the session."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from safetensors.torch import save_file

from sample_models import SAMPLES
from tests.e2e.conftest import ROOT, _free_port, _wait_healthy
from ui.uploads import UPLOAD_DIR

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def short_lived_sessions(chromium_path, artifacts):
    """`streamlit run app.py` that forgets a closed tab's session after 2 s (default 120 s)."""
    port = _free_port()
    log = open(artifacts / "streamlit-uploads.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamlit", "run", "app.py", "--server.port", str(port), "--server.headless",
         "true", "--server.address", "127.0.0.1", "--server.disconnectedSessionTTL", "2"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, timeout=120)
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _folders(pid: int) -> list:
    return [d for d in UPLOAD_DIR.iterdir() if d.name.startswith(f"{pid}-")] if UPLOAD_DIR.is_dir() else []


def test_an_upload_is_removed_when_its_session_ends(short_lived_sessions, chromium, tmp_path, wait_for_app):
    url, pid = short_lived_sessions
    model = SAMPLES["tiny-gpt2"].build()
    path = tmp_path / "weights.safetensors"
    save_file({k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}, str(path))
    context = chromium.new_context()
    page = context.new_page()
    page.goto(url, wait_until="domcontentloaded")
    wait_for_app(page)
    page.get_by_text("Checkpoint (optional)").click()
    page.locator('input[type="file"]').set_input_files(str(path))
    deadline = time.monotonic() + 60
    while not _folders(pid) and time.monotonic() < deadline:
        page.wait_for_timeout(250)
    (folder,) = _folders(pid)
    assert [f.name.endswith("-weights.safetensors") for f in folder.iterdir()] == [True]
    context.close()  # the tab is gone; the server drops the session 2 s later, on its next visit
    deadline = time.monotonic() + 90
    while folder.exists() and time.monotonic() < deadline:
        visit = chromium.new_context()
        visit.new_page().goto(url, wait_until="domcontentloaded")
        time.sleep(3)
        visit.close()
    assert not folder.exists()
