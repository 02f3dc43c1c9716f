"""A model whose names carry Markdown and HTML payloads, in the real dashboard and the HTML report
in Chromium, with every request to another host blocked and recorded: none is made, and no
name becomes a link, an image or a script."""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import urlencode, urlparse

import pytest

from inspector import load_model
from inspector.report import build_report
from tests.e2e.conftest import serve_app
from tests.hostile_names import IMG, JS, KEY, write_hostile_model

pytestmark = pytest.mark.e2e

# Anything a payload could make the browser fetch or follow.
LIVE = ('img[src*="evil"], img[src*=":9/"], img[src="x"], img[onerror], a[href*="javascript"], '
        'a[href*="evil"], a[href*=":9/"], svg a')


@pytest.fixture(scope="module")
def hostile_app(chromium_path, tmp_path_factory, artifacts):
    """Its own `streamlit run app.py`, allowed to load model files from the test's folder."""
    folder = tmp_path_factory.mktemp("hostile-browser")
    source, checkpoint = write_hostile_model(folder)
    env = {**os.environ, "INSPECTOR_MODEL_DIRS": str(folder)}
    with serve_app(artifacts / "streamlit-hostile.log", env=env) as server:
        yield server.url, source, checkpoint


def _guarded_context(chromium, allowed: str | None):
    """A browser context that aborts and records every request not to ``allowed`` (scheme://host:port)."""
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    blocked: list[str] = []

    def route(r):
        url = r.request.url
        parts = urlparse(url)
        if (allowed and f"{parts.scheme}://{parts.netloc}" == allowed) or parts.scheme in (
            "file",
            "data",
            "blob",
        ):
            r.continue_()
        else:
            blocked.append(url)
            r.abort()

    context.route("**/*", route)
    return context, blocked


def _assert_inert(page, where: str) -> None:
    live = page.locator(LIVE)
    assert live.count() == 0, f"{where}: {live.first.evaluate('e => e.outerHTML')[:300]}"


def test_dashboard_shows_hostile_names_as_text_and_fetches_nothing(hostile_app, chromium, artifacts,
                                                                   wait_for_app):
    url, source, checkpoint = hostile_app
    context, blocked = _guarded_context(chromium, url)
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        page.goto(
            f"{url}/?{urlencode({'model': source, 'checkpoint': checkpoint})}", wait_until="domcontentloaded"
        )
        wait_for_app(page)
        sidebar = page.locator('[data-testid="stSidebar"]')
        # the unexpected checkpoint key is listed in the sidebar, as the characters it holds
        sidebar.get_by_text(KEY, exact=False).first.wait_for(timeout=60_000)
        assert JS in sidebar.inner_text()
        _assert_inert(page, "home")
        page.screenshot(path=artifacts / "hostile-home.png", full_page=True)
        nav = page.locator('[data-testid="stSidebarNav"]')
        for name in ("Flatten_map", "Hook_captures", "Alias_graph"):
            nav.locator(f'a[href*="{name}"]').first.click()
            page.wait_for_url(re.compile(name), timeout=30_000)
            wait_for_app(page)
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
            page.mouse.move(700, 500)  # hover texts are drawn on demand
            _assert_inert(page, name)
            assert page.locator('[data-testid="stException"]').count() == 0
        nav.locator('a[href*="Report"]').first.click()
        page.wait_for_url(re.compile("Report"), timeout=30_000)
        wait_for_app(page)
        page.get_by_role("button", name="Build report").click()
        wait_for_app(page)
        preview = page.locator('[data-testid="stExpander"]', has_text="Preview (Markdown)")
        preview.wait_for(timeout=120_000)
        text = preview.inner_text()
        assert IMG in text and JS in text  # shown as the text it is
        _assert_inert(page, "report preview")
        page.screenshot(path=artifacts / "hostile-report.png", full_page=True)
        assert blocked == [], blocked
        assert dialogs == []
    finally:
        context.close()


def test_html_report_figures_keep_hostile_names_inert(hostile_app, chromium, tmp_path, monkeypatch):
    _, source, checkpoint = hostile_app
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(Path(source.rpartition(":")[0]).parent))
    report = build_report(load_model(source, checkpoint=checkpoint), backward=True)
    path = tmp_path / "hostile.html"
    path.write_text(report.to_html(), encoding="utf-8")
    n_figures = sum(len(s.figures) for s in report.sections)
    context, blocked = _guarded_context(chromium, None)
    page = context.new_page()
    try:
        page.goto(path.as_uri(), wait_until="load")
        page.wait_for_function(
            f"document.querySelectorAll('.js-plotly-plot .main-svg').length >= {n_figures}", timeout=30_000
        )
        for plot in page.locator(".js-plotly-plot").all():
            plot.hover()
        _assert_inert(page, "HTML report")
        svg_text = " ".join(page.locator(".js-plotly-plot").all_inner_texts())
        assert "<img" in svg_text or "<a href" in svg_text or JS in svg_text  # names drawn as text
        assert blocked == [], blocked
    finally:
        context.close()
