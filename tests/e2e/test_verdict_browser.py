"""The Training page's verdict and step addresses in Chromium at 1400×1000: a run whose only finding is
a warning opens on it with a button to its step, and ``?step=`` / ``&finding=`` open a step in sight."""

from __future__ import annotations

import os
import time

import pytest

from tests.e2e.conftest import ARTIFACTS, serve_app

pytestmark = pytest.mark.e2e

VIEWPORT = {"width": 1400, "height": 1000}
STEP_HEADING = '[data-testid="stMain"] h3:has-text("Modules at step")'


@pytest.fixture(scope="module")
def site(chromium, tmp_path_factory):
    """One app whose runs folder holds a synthetic run of 2,000 steps × 40 modules: its only finding an
    ``exploding-gradient`` warning at ``layers.20``, step 1,500."""
    from inspector.watching import synthetic_run

    runs = tmp_path_factory.mktemp("verdict-runs")
    synthetic_run(runs / "warn.inspect", steps=2_000, modules=40)
    env = dict(os.environ, INSPECTOR_RUNS=str(runs))
    with serve_app(ARTIFACTS / "verdict-streamlit.log", env=env) as server:
        page = chromium.new_page(viewport=VIEWPORT)
        page.set_default_timeout(120_000)
        try:
            yield server.url, page, runs / "warn.inspect"
        finally:
            page.close()


def _open(page, url: str, wait_for_app) -> None:
    page.goto(url, wait_until="domcontentloaded")
    wait_for_app(page)
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stSkeleton\"]')", timeout=90_000)


def _in_sight(page, selector: str) -> bool:
    """Whether the element's top lies inside the window without scrolling."""
    box = page.locator(selector).first.bounding_box()
    return box is not None and 0 <= box["y"] < VIEWPORT["height"] - 40


def test_a_run_with_only_a_warning_opens_on_it_and_goes_to_its_step(site, wait_for_app):
    url, page, run = site
    _open(page, f"{url}/Training?run={run}", wait_for_app)
    verdict = page.locator(".st-key-train_verdict")
    assert "No errors. First warning: step 1,500 · exploding-gradient at layers.20" in verdict.inner_text()
    button = page.get_by_role("button", name="Go to step 1,500")
    assert _in_sight(page, ".st-key-train_verdict") and button.is_visible()
    started = time.monotonic()
    button.click()
    page.wait_for_selector('[data-testid="stMain"] h3:has-text("Modules at step 1,500")')
    wait_for_app(page)
    print(f"Go to step: {time.monotonic() - started:.2f} s")
    assert "step=1500" in page.url and "finding=1" in page.url
    assert _in_sight(page, STEP_HEADING)  # right under the verdict, no scrolling
    page.screenshot(path=ARTIFACTS / "verdict-warning.png")


def test_an_address_opens_a_step_and_a_finding_in_sight(site, wait_for_app):
    url, page, run = site
    _open(page, f"{url}/Training?run={run}&step=700", wait_for_app)
    assert page.locator(STEP_HEADING).first.inner_text() == "Modules at step 700"
    assert _in_sight(page, STEP_HEADING)
    # a finding picked from the list far below: the page comes back up to the step view
    picker = page.locator(".st-key-train_jump")
    picker.scroll_into_view_if_needed()
    assert not _in_sight(page, STEP_HEADING)
    picker.click()
    page.get_by_role("option", name="step 1500 · exploding-gradient · layers.20").click()
    page.wait_for_selector('[data-testid="stMain"] h3:has-text("Modules at step 1,500")')
    wait_for_app(page)
    assert _in_sight(page, STEP_HEADING) and "step=1500" in page.url
    _open(page, f"{url}/Training?run={run}&finding=1", wait_for_app)
    assert page.locator(STEP_HEADING).first.inner_text() == "Modules at step 1,500"
    assert _in_sight(page, STEP_HEADING) and "step=1500" in page.url
