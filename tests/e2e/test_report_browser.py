"""The HTML report in Debian's Chromium with the network cut off: no requests, every chart drawn."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from torch import nn

from inspector import Finding, LoadedModel, load_model
from inspector.report import Report, Section, build_report, make_figure

CHROMIUM = "/usr/bin/chromium"
HOSTILE = "<img src=x onerror=alert(1)>"

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK), reason=f"needs Debian's chromium at {CHROMIUM}"),
]


class Hostile(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({HOSTILE: nn.Linear(2, 2)})  # 4 + 2 = 6 elements

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[HOSTILE](x)


def _report_with_hostile_names() -> Report:
    """A full report of a model whose module is named with HTML, plus one more hostile figure.

    Every analysis shows the name somewhere: tables, the alias graph, the placement treemap,
    the capture statistics, the attribution bars.
    """
    import plotly.graph_objects as go

    torch.manual_seed(0)
    loaded = LoadedModel(Hostile(), f"tiny {HOSTILE}", "test:hostile",
                         findings=[Finding("hostile", "warning", f"blocks.{HOSTILE}", f"named {HOSTILE}")],
                         inputs_fn=lambda b: torch.ones(b, 2), loss_fn=lambda out, inp: out.pow(2).mean())
    report = build_report(loaded, backward=True, max_memory="0=40,cpu=1000")
    fig = go.Figure(go.Bar(x=[HOSTILE, "</script><script>alert(2)</script>"], y=[1, 2]))
    extra = Section("labs", "Lab results", figures=(make_figure(HOSTILE, fig),))
    sections = tuple(extra if s.id == "labs" else s for s in report.sections)
    return Report(report.model, report.options, sections, report.created, report.environment)


@pytest.fixture
def browser(chromium):
    """The session's headless Chromium (tests/e2e/conftest.py): /usr/bin/chromium, launched with
    --headless --no-sandbox --disable-gpu --disable-background-networking."""
    return chromium


def _open(browser, path: Path):
    context = browser.new_context()
    page = context.new_page()
    requests: list[str] = []
    dialogs: list[str] = []
    errors: list[str] = []

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            requests.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("pageerror", lambda e: errors.append(str(e)))
    # plotly.js logs a colour it cannot read (and draws it black): count those as errors too
    page.on("console", lambda m: errors.append(m.text) if "Invalid color" in m.text else None)
    page.goto(path.as_uri(), wait_until="load")
    return context, page, requests, dialogs, errors


def test_html_report_is_offline_draws_every_chart_and_runs_no_names(browser, tmp_path):
    report = _report_with_hostile_names()
    n_figures = sum(len(s.figures) for s in report.sections)
    assert n_figures >= 1
    path = tmp_path / "report.html"
    path.write_text(report.to_html(), encoding="utf-8")
    context, page, requests, dialogs, errors = _open(browser, path)
    try:
        page.wait_for_function(f"document.querySelectorAll('.js-plotly-plot').length === {n_figures}",
                               timeout=30_000)
        assert page.locator(".js-plotly-plot").count() == n_figures
        assert page.locator(".js-plotly-plot .main-svg").count() >= n_figures  # drawn, not just a div
        assert requests == []
        assert dialogs == []
        assert errors == []
        assert page.locator("img").count() == 0
        assert page.locator("[onerror]").count() == 0
        # the name reads as text, in the title and in the findings
        assert HOSTILE in page.locator("h1").inner_text()
        assert HOSTILE in page.locator("#section-findings").inner_text()
        # the table of contents and the finding links point at sections that exist
        hrefs = page.eval_on_selector_all("a[href^='#']", "els => els.map(e => e.getAttribute('href'))")
        assert "#section-findings" in hrefs
        for href in set(hrefs):
            assert page.locator(href).count() == 1, href
    finally:
        context.close()


def test_pdf_export_prints_the_report(tmp_path):
    report = build_report(load_model("sample:tiny-gpt2"), ["summary"])
    out = report.to_pdf(tmp_path / "report.pdf")
    data = out.read_bytes()
    assert data.startswith(b"%PDF-") and len(data) > 1000
    from ui.report_downloads import pdf_bytes

    assert pdf_bytes(report).startswith(b"%PDF-")  # what the dashboard's PDF button makes when pressed
