"""The dashboard in a real browser: every page from the sidebar, charts drawn, no exception shown."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.e2e

# Pages that draw a plotly chart as soon as they open on the default model.
CHART_PAGES = ("Alias_graph", "Flatten_map", "Device_map", "Hook_captures", "Attributions")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower() or "home"


def _nav_links(page) -> list[tuple[str, str]]:
    nav = page.locator('[data-testid="stSidebarNav"]')
    more = nav.get_by_role("button", name=re.compile("View (more|less)"))
    if more.count() and "more" in more.first.inner_text().lower():
        more.first.click()
    links = nav.locator("a")
    return [(links.nth(i).get_attribute("href") or "", links.nth(i).inner_text().strip())
            for i in range(links.count())]


def test_every_page_from_the_sidebar(app_url, chromium, artifacts, wait_for_app):
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    try:
        page.goto(app_url, wait_until="domcontentloaded")
        wait_for_app(page)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert "Model Inspector" in page.locator("h1").first.inner_text()
        # The default model is loaded: its metrics are on the home page.
        page.get_by_text("4,080", exact=True).first.wait_for(timeout=30_000)
        page.screenshot(path=artifacts / "page-home.png", full_page=True)

        links = _nav_links(page)
        assert len(links) >= 2, links  # home plus at least one view
        visited = []
        for href, text in links:
            nav = page.locator('[data-testid="stSidebarNav"]')
            nav.locator(f'a[href="{href}"]').first.click()
            page.wait_for_url(re.compile(re.escape(href.rstrip("/")) + r"/?(\?.*)?$"), timeout=30_000)
            wait_for_app(page)
            if any(key.lower() in href.lower() or key.replace("_", " ").lower() in text.lower()
                   for key in CHART_PAGES):
                page.wait_for_selector(".js-plotly-plot", timeout=60_000)
                assert page.locator(".js-plotly-plot .main-svg").count() >= 1
            exceptions = page.locator('[data-testid="stException"]')
            assert exceptions.count() == 0, f"{text}: {exceptions.first.inner_text()[:500]}"
            page.screenshot(path=artifacts / f"page-{_slug(text)}.png", full_page=True)
            visited.append(text)
        assert len(visited) == len(links)
        assert page_errors == []
    finally:
        context.close()


def test_picker_loads_another_model_in_the_browser(app_url, chromium, artifacts, wait_for_app):
    """Pick a sample in the sidebar, press Load: the status shows and the home page follows."""
    context = chromium.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    try:
        page.goto(app_url, wait_until="domcontentloaded")
        wait_for_app(page)
        sidebar = page.locator('[data-testid="stSidebar"]')
        sidebar.locator('[data-testid="stSelectbox"]').first.click()
        page.get_by_role("option", name="cnn-bn").click()
        wait_for_app(page)
        sidebar.get_by_role("button", name="Load model").click()
        wait_for_app(page)
        # ConvNet: 224 + 1168 + 32 + 170 = 1594 parameter elements.
        page.get_by_text("1,594", exact=True).first.wait_for(timeout=90_000)
        sidebar.get_by_role("button", name=re.compile(r"Loaded$")).wait_for(timeout=30_000)
        assert sidebar.get_by_role("button", name=re.compile(r"Loaded$")).is_disabled()
        assert page.locator('[data-testid="stException"]').count() == 0
        page.screenshot(path=artifacts / "picker-cnn-bn.png", full_page=True)
    finally:
        context.close()


def _bytes_held(page) -> str:
    metric = page.locator('[data-testid="stMetric"]').filter(has_text="Bytes held")
    return metric.locator('[data-testid="stMetricValue"]').inner_text().strip()


def _expected_bytes(batch: int) -> str:
    """What one capture of every tiny-gpt2 module on ``batch`` example inputs holds."""
    from inspector import format_bytes, load_model
    from inspector.capture import capture_activations

    loaded = load_model("sample:tiny-gpt2")
    return format_bytes(capture_activations(loaded.model, loaded.example_inputs(batch)).total_bytes)


def test_two_sessions_capture_on_one_model_at_once(app_url, chromium, artifacts, wait_for_app):
    """Two browser contexts capture on the same cached model together; each sees its own inputs."""
    one, four = _expected_bytes(1), _expected_bytes(4)
    assert one != four
    contexts = [chromium.new_context(viewport={"width": 1400, "height": 1000}) for _ in range(2)]
    try:
        a, b = (c.new_page() for c in contexts)
        for page in (a, b):
            page.goto(f"{app_url}/Hook_captures", wait_until="domcontentloaded")
        for page in (a, b):
            wait_for_app(page)
            page.wait_for_selector(".js-plotly-plot", timeout=60_000)
        # Batch size 1 in one session and 4 in the other, sent before either run finishes.
        a.locator('[data-testid="stSlider"] input[type="range"]').first.press("Home")
        b.locator('[data-testid="stSlider"] input[type="range"]').first.press("End")
        for page in (a, b):
            wait_for_app(page)
        assert (_bytes_held(a), _bytes_held(b)) == (one, four)
        # Rerun both (the "r" shortcut): the page then offers "Capture again".
        for page in (a, b):
            page.locator("h1").first.click()
            page.keyboard.press("r")
        for page in (a, b):
            wait_for_app(page)
        assert (_bytes_held(a), _bytes_held(b)) == (one, four)
        # Capture again in both at once: the shared model's lock serialises the two forward passes.
        a.get_by_role("button", name="Capture again").click()
        b.get_by_role("button", name="Capture again").click()
        for page in (a, b):
            wait_for_app(page)
        assert (_bytes_held(a), _bytes_held(b)) == (one, four)
        for name, page in (("a", a), ("b", b)):
            assert page.locator('[data-testid="stException"]').count() == 0
            page.screenshot(path=artifacts / f"captures-session-{name}.png", full_page=True)
    finally:
        for c in contexts:
            c.close()
