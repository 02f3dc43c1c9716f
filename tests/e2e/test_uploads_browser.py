"""An uploaded checkpoint lives as long as its browser session: a real server, a real upload,
the tab closed, and the session's folder gone once Streamlit forgets the session."""

from __future__ import annotations

import time

import pytest
from safetensors.torch import save_file

from sample_models import SAMPLES
from tests.e2e.conftest import serve_app
from ui.uploads import upload_base

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def short_lived_sessions(chromium_path, artifacts):
    """`streamlit run app.py` that forgets a closed tab's session after 2 s (default 120 s)."""
    with serve_app(
        artifacts / "streamlit-uploads.log", options=["--server.disconnectedSessionTTL", "2"]
    ) as server:
        yield server.url, server.pid


def _folders(pid: int) -> list:
    """The session folders of the server ``pid`` (in its own folder of the user's uploads)."""
    base = upload_base()
    servers = [d for d in base.iterdir() if d.name.startswith(f"{pid}-")] if base.is_dir() else []
    return [d for server in servers for d in server.iterdir() if d.is_dir()]


def test_an_upload_is_removed_when_its_session_ends(short_lived_sessions, chromium, tmp_path, wait_for_app):
    url, pid = short_lived_sessions
    model = SAMPLES["tiny-gpt2"].build()
    path = tmp_path / "weights.safetensors"
    save_file(
        {k: v.detach().clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}, str(path)
    )
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
