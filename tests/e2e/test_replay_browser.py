"""A kept step replayed in Chromium: the Training page's "Replay this step" on an error finding opens the
Hook captures page at ``?run=...&step=N&replay=1`` with "Step N, replayed" (the op and its line)."""

from __future__ import annotations

import os
from urllib.parse import quote

import pytest

from inspector.__main__ import main
from tests.e2e.conftest import ARTIFACTS, serve_app
from tests.test_replay_cli import PLANTED

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def site(chromium, tmp_path_factory):
    """One app whose runs folder holds 4 steps of planted.py trained with ``--keep`` (log(-0.5), step 2)."""
    runs = tmp_path_factory.mktemp("replay-runs")
    (runs / "planted.py").write_text(PLANTED)
    run = runs / "run.inspect"
    with pytest.MonkeyPatch.context() as mp:  # the model file's folder allowed while it trains
        mp.setenv("INSPECTOR_MODEL_DIRS", str(runs))
        assert main(["watch", f"{runs / 'planted.py'}:build", "--steps", "4", "--keep", "--optimizer", "sgd",
                     "-o", str(run)]) == 0
    env = dict(os.environ, INSPECTOR_RUNS=str(runs), INSPECTOR_MODEL_DIRS=str(runs))
    with serve_app(ARTIFACTS / "replay-streamlit.log", env=env) as server:
        page = chromium.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(120_000)
        try:
            yield server.url, page, run
        finally:
            page.close()


def test_replay_this_step_opens_the_hook_captures_page_replayed(site, wait_for_app):
    url, page, run = site
    model = quote(f"{run.parent / 'planted.py'}:build")
    page.goto(f"{url}/Training?run={quote(str(run))}&model={model}", wait_until="domcontentloaded")
    wait_for_app(page)
    button = page.get_by_role("button", name="Replay this step").first
    button.wait_for()
    button.click()
    page.get_by_role("heading", name="Step 2, replayed").wait_for()
    wait_for_app(page)
    assert "/Hook_captures?" in page.url and "replay=1" in page.url and "step=2" in page.url
    main_text = page.locator('[data-testid="stMain"]').inner_text()
    assert "step 2: reproduced" in main_text and "aten.log.default" in main_text
    page.screenshot(path=str(ARTIFACTS / "replay-hook-captures.png"), full_page=True)
