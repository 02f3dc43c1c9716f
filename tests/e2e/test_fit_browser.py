"""Every page at 1400x1000 in Chromium, as a new user first sees it: no text cut off in the first
screen (an HTML cell or a one-line box whose text is wider than its box), no raw number of 7 or more
digits anywhere in the page's text, and the Training page opening with its run's first error.

One app (with a runs folder holding a real NaN run and a 10,000-step run) and one browser for all.
A screenshot of each page's first screen goes to test-artifacts/fit/.
"""

from __future__ import annotations

import os
import re

import pytest

from tests.e2e.conftest import ARTIFACTS, serve_app

pytestmark = pytest.mark.e2e

VIEWPORT = {"width": 1400, "height": 1000}
RAW_NUMBER = re.compile(r"(?<![\w.,:/%-])\d{7,}(?![\w.,%])")  # 7+ digits without separators

# Elements in the first screen that show text on one line in a box narrower than the text: table cells,
# and boxes that clip or ellipsize (metric values, select boxes, labels). SVG text has no box and is left out.
CLIPPED_JS = """
() => {
  const out = [];
  const H = window.innerHeight;
  for (const el of document.querySelectorAll('[data-testid="stMain"] *')) {
    if (!el.clientWidth) continue;
    const r = el.getBoundingClientRect();
    if (r.bottom <= 0 || r.top >= H) continue;
    if (![...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())) continue;
    const cs = getComputedStyle(el);
    const clips = el.tagName === 'TD' || el.tagName === 'TH' || cs.textOverflow === 'ellipsis'
      || ((cs.overflowX === 'hidden' || cs.overflowX === 'clip') && cs.whiteSpace === 'nowrap');
    if (clips && el.scrollWidth > el.clientWidth + 1) {
      const id = el.getAttribute('data-testid') || '';
      out.push(`${el.tagName}.${id}: ${el.textContent.trim().slice(0, 70)}`);
    }
  }
  return out;
}
"""

# Text of every plotly chart shown (axis titles, tick labels, plan names under the devices, keys) that
# reaches outside the chart's own SVG: cut off at the chart's edge.
SVG_CUT_JS = """
() => {
  const out = [];
  for (const box of document.querySelectorAll('[data-testid="stPlotlyChart"] .svg-container')) {
    const b = box.getBoundingClientRect();
    if (!b.width) continue;  // in a tab not shown
    for (const t of box.querySelectorAll('text')) {
      const r = t.getBoundingClientRect();
      const outside = r.left < b.left - 1 || r.right > b.right + 1
        || r.bottom > b.bottom + 1 || r.top < b.top - 1;
      const where = `${Math.round(r.left - b.left)}..${Math.round(r.right - b.left)}`;
      if (r.width && outside) out.push(`${t.textContent.slice(0, 50)}: ${where}`);
    }
  }
  return out;
}
"""
SHOW_CHARTS_JS = """
() => {
  for (const c of document.querySelectorAll('[data-testid="stPlotlyChart"]')) {
    if (c.offsetWidth) c.scrollIntoView();
  }
}
"""


def _nan_run(path) -> None:
    """A real watched loop: a Linear whose output turns NaN at step 29 of 40."""
    import torch
    from torch import nn

    from inspector import watch

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    calls = []

    def poison(module, inputs, output):
        calls.append(1)
        return output * float("nan") if len(calls) == 30 else None

    model[0].register_forward_hook(poison)
    with watch(model, opt, path, nonfinite=True) as w:
        for _ in range(40):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()


@pytest.fixture(scope="module")
def site(chromium, tmp_path_factory):
    from inspector.watching import synthetic_run

    runs = tmp_path_factory.mktemp("fit-runs")
    _nan_run(runs / "nan.inspect")
    synthetic_run(runs / "long.inspect", steps=10_000, modules=40, chunk=2_000)
    env = dict(os.environ, INSPECTOR_RUNS=str(runs))
    with serve_app(ARTIFACTS / "fit-streamlit.log", env=env) as server:
        page = chromium.new_page(viewport=VIEWPORT)
        try:
            yield server.url, page, runs
        finally:
            page.close()


PAGES = [  # a page other than Home first: the server's first visit is by a page's own address
    ("alias-graph", "Alias_graph"),
    ("home", ""),
    ("flatten-map", "Flatten_map"),
    ("device-map", "Device_map"),
    ("hook-captures", "Hook_captures"),
    ("attributions", "Attributions"),
    ("report", "Report"),
    ("labs", "Labs"),
    ("training", "Training?run={runs}/nan.inspect"),
    ("compare", "Compare"),
]


@pytest.mark.parametrize(("name", "address"), PAGES, ids=[n for n, _ in PAGES])
def test_the_first_screen_fits_and_reads(site, wait_for_app, name, address):
    url, page, runs = site
    page.goto(f"{url}/{address.format(runs=runs)}", wait_until="domcontentloaded")
    wait_for_app(page)
    # a page whose first run reruns it (an editor settling its value) shows placeholders meanwhile
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stSkeleton\"]')", timeout=90_000)
    wait_for_app(page)
    page.wait_for_timeout(500)
    folder = ARTIFACTS / "fit"
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=folder / f"{name}.png")
    assert page.locator('[data-testid="stException"]').count() == 0, name
    nav = page.locator('[data-testid="stSidebarNav"] a').all_inner_texts()
    titles = [t.split("\n")[-1].strip() for t in nav]
    assert titles[0] == "Home" and "app" not in titles and "Distributed" not in titles, titles
    clipped = page.evaluate(CLIPPED_JS)
    assert not clipped, f"{name}: text cut off in the first screen: {clipped[:8]}"
    text = page.locator('[data-testid="stMain"]').inner_text()
    raw = sorted({m.group() for m in RAW_NUMBER.finditer(text)})
    assert not raw, f"{name}: numbers of 7+ digits without separators: {raw[:8]}"
    if name == "device-map":
        cut = []
        for tab in ("Treemap", "Bytes per device"):  # each tab's charts drawn, then their labels checked
            page.get_by_role("tab", name=tab).first.click()
            page.wait_for_timeout(800)
            page.evaluate(SHOW_CHARTS_JS)
            page.wait_for_timeout(500)
            cut += page.evaluate(SVG_CUT_JS)
        assert not cut, f"device-map: chart labels cut at the chart's edge: {cut[:8]}"
    if name == "training":
        assert "First error: step 29 · nonfinite-forward at 0" in text
        page.get_by_role("button", name="Go to step 29").click()
        wait_for_app(page)
        assert page.get_by_text("Modules at step 29").count() == 1
        page.get_by_text("run(s) in the runs folders").click()  # the runs table: every column fits
        page.wait_for_timeout(300)
        page.screenshot(path=folder / "training-runs.png")
