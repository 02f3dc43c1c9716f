"""Every page with its main control, as people use it, on three models in a real browser.

One server and one browser for all (tests/e2e/conftest.py); one browser context per model,
which opens the model from a link and then moves between pages with the sidebar, so each
model is one browser session. On each page: press its main control (backward, capture,
attribute, build and export a report, check a lab answer), then check that no exception is
shown, no metric or table cell is cut off, and the page's figure is drawn. Screenshots go
to test-artifacts/.
"""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.e2e

MODELS = {  # name -> the link's query
    "tiny-gpt2": "model=sample:tiny-gpt2",
    "cnn-bn-float16": "model=sample:cnn-bn&dtype=float16",
    "llama-70b-meta": "model=sample:llama-70b-meta&device=meta",
}
RUNS = {"tiny-gpt2", "cnn-bn-float16"}  # models with weights: the controls that run them work

# Elements whose text is cut (wider than their box and not scrolled into view): metric values,
# their labels and deltas, and the cells of HTML tables (st.table, Markdown tables).
CLIPPED_JS = """() => {
  const boxes = [...document.querySelectorAll(
    '[data-testid="stMetricValue"], [data-testid="stMetricLabel"], [data-testid="stMetricDelta"], ' +
    '[data-testid="stMain"] td, [data-testid="stMain"] th')];
  return boxes.filter(box => [box, ...box.querySelectorAll('*')].some(el => {
      const style = getComputedStyle(el);
      const hides = ['hidden', 'clip'].includes(style.overflowX) || style.textOverflow === 'ellipsis';
      return hides && el.scrollWidth > el.clientWidth + 1;
    })).map(box => box.innerText.slice(0, 80));
}"""


class ModelPages:
    """One browser session on one model: open it from a link, then use each page."""

    def __init__(self, browser, app_url: str, name: str, artifacts, wait_for_app) -> None:
        self.name, self.artifacts, self.wait = name, artifacts, wait_for_app
        # tall enough that a screenshot shows the figures too (the app scrolls inside its own container)
        self.context = browser.new_context(viewport={"width": 1400, "height": 2600}, accept_downloads=True)
        self.page = self.context.new_page()
        self.page.set_default_timeout(120_000)  # two shared cores under load: a page switch can be slow
        self.errors: list[str] = []
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.goto(f"{app_url}/?{MODELS[name]}", wait_until="domcontentloaded")
        self.settle()

    def settle(self) -> None:
        self.wait(self.page)
        self.page.wait_for_timeout(300)  # let the last elements leave their loading skeletons

    def go(self, title: str) -> None:
        """Open a page from the sidebar navigation by its title."""
        self.page.locator('[data-testid="stSidebarNav"]').get_by_role("link", name=title, exact=True).click()
        self.settle()

    def press(self, name: str | re.Pattern) -> None:
        self.page.get_by_role("button", name=name).first.click()
        self.settle()

    def check(self, shot: str, figure: bool) -> None:
        """No exception, nothing cut off, the figure drawn; then a screenshot."""
        page = self.page
        exceptions = page.locator('[data-testid="stException"]')
        assert exceptions.count() == 0, f"{self.name}/{shot}: {exceptions.first.inner_text()[:500]}"
        if figure:
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
        page.wait_for_timeout(200)
        assert page.evaluate(CLIPPED_JS) == [], f"{self.name}/{shot}: cut off"
        page.screenshot(path=self.artifacts / f"use-{self.name}-{shot}.png", full_page=True)

    def text(self) -> str:
        return self.page.locator('[data-testid="stMain"]').inner_text()


@pytest.mark.parametrize("name", list(MODELS))
def test_every_page_with_its_main_control(name, app_url, chromium, artifacts, wait_for_app):
    m = ModelPages(chromium, app_url, name, artifacts, wait_for_app)
    runs = name in RUNS
    try:
        m.page.wait_for_selector('[data-testid="stMetricValue"]', timeout=60_000)
        m.check("home", figure=False)
        if name == "llama-70b-meta":  # 68,976,648,192 parameter elements, shown so that they fit
            assert "69.0 billion" in m.text() and "69.0 B" not in m.text()

        m.go("Alias graph")
        m.press("Run conversion check")
        assert re.search(r"\b(kept|broken|weakened|no ties)\b", m.text())  # the outcome line
        m.check("aliases", figure=True)

        m.go("Flatten map & gradients")
        backward = m.page.get_by_role("button", name="Run a backward pass")
        if runs:
            m.press("Run a backward pass")
            assert "Ran a backward pass" in m.text()
        else:
            assert backward.is_disabled()
        m.check("offsets", figure=True)

        m.go("Device map")
        m.check("devicemap", figure=True)

        m.go("Hook captures")
        if runs:
            m.press(re.compile(r"^Capture( again)?$"))
            assert "Captured outputs" in m.text()
        else:
            assert "meta device" in m.text()
        m.check("captures", figure=runs)

        m.go("Attributions")
        if runs:
            if m.page.get_by_role("button", name="Compute attributions").count():
                m.press("Compute attributions")
            m.page.wait_for_selector('[data-testid="stExpander"] >> text=done', timeout=60_000)
        else:
            assert "meta device" in m.text()
        m.check("attributions", figure=runs)

        m.go("Report")
        m.press("Build report")
        html = m.page.get_by_role("button", name=re.compile("^HTML"))
        html.wait_for(timeout=120_000)
        with m.page.expect_download() as download:
            html.click()
        path = download.value.path()
        assert path is not None and "<html" in open(path, encoding="utf-8").read(2000).lower()
        m.check("report", figure=False)

        m.go("Labs")
        m.page.get_by_role("button", name="Check").first.click()
        m.settle()
        alerts = m.page.locator('[data-testid="stAlert"]')
        assert alerts.count() >= 1  # the inspector graded the (empty) answer and said so
        m.check("labs", figure=False)
        assert m.errors == []
    finally:
        m.context.close()


def _metric(page, label: str) -> str:
    metric = page.locator('[data-testid="stMetric"]').filter(has_text=re.compile(f"^{re.escape(label)}"))
    return metric.first.locator('[data-testid="stMetricValue"]').inner_text().strip()


def test_one_sessions_backward_pass_is_not_seen_by_another(app_url, chromium, artifacts, wait_for_app):
    """A class on one server: a student's gradients stay in their own browser session."""
    a = ModelPages(chromium, app_url, "tiny-gpt2", artifacts, wait_for_app)
    b = ModelPages(chromium, app_url, "tiny-gpt2", artifacts, wait_for_app)
    try:
        for m in (a, b):
            m.go("Flatten map & gradients")
        a.press("Run a backward pass")
        assert _metric(a.page, "ok") == "16"
        b.page.locator("h1").first.click()
        b.page.keyboard.press("r")  # rerun b after a's backward pass on the same cached model
        b.settle()
        assert (_metric(b.page, "ok"), _metric(b.page, "no gradient")) == ("0", "16")
        assert _metric(b.page, "Whole-model norm") == "—"
        for tag, m in (("a", a), ("b", b)):
            m.check(f"gradients-session-{tag}", figure=True)
    finally:
        a.context.close()
        b.context.close()
