"""A reader's walk through every page in Chromium (1440x900): each page's main control, a screenshot
of each step under test-artifacts/readable/, and what the reader sees checked: sizes in human units
(no raw byte count over 10,000), no tick labels drawn over each other, and the statements right."""

from __future__ import annotations

import re
import time

import pytest

pytestmark = pytest.mark.e2e

VIEWPORT = {"width": 1440, "height": 900}
TIMES: list[tuple[str, float]] = []
STARTED = [time.monotonic()]
RAW_NUMBER = re.compile(r"(?<![\w.,:/%-])\d{5,}(?![\w.,%])")  # 5+ digits without separators

# Every tick label box of every plotly figure, per axis; pairs of one axis that overlap by more than 1 px.
OVERLAPS_JS = """
() => {
  const out = [];
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    for (const axis of plot.querySelectorAll('g.xaxislayer-above, g.yaxislayer-above')) {
      const boxes = [...axis.querySelectorAll('g.xtick text, g.ytick text')]
        .filter(t => t.textContent.trim() && t.getBoundingClientRect().width > 0)
        .map(t => [t.textContent, t.getBoundingClientRect()]);
      for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
        const [ta, a] = boxes[i], [tb, b] = boxes[j];
        const dx = Math.min(a.right, b.right) - Math.max(a.left, b.left);
        const dy = Math.min(a.bottom, b.bottom) - Math.max(a.top, b.top);
        if (dx > 1 && dy > 1) out.push(ta + ' / ' + tb);
      }
    }
  }
  return out;
}
"""


def _visible_text(page) -> str:
    return page.locator('[data-testid="stAppViewContainer"]').inner_text() + "\n" + \
        page.locator('[data-testid="stSidebar"]').inner_text()


def _check_reads_well(page, where: str) -> str:
    """Assert what every page must keep; returns the page's visible text."""
    text = _visible_text(page)
    assert page.locator('[data-testid="stException"]').count() == 0, where
    raw = [m.group() for m in RAW_NUMBER.finditer(text)]
    assert not raw, f"{where}: numbers without units or separators: {raw[:5]}"
    overlaps = page.evaluate(OVERLAPS_JS)
    assert not overlaps, f"{where}: tick labels drawn over each other: {overlaps[:5]}"
    return text


def _open(page, url: str, wait_for_app, charts: bool = False) -> None:
    """Open ``url``: the first time by address, then through the sidebar, in the same session."""
    path = url.split("/", 3)[3] if url.count("/") > 2 else ""
    nav = page.locator(f'[data-testid="stSidebarNav"] a[href$="/{path}"]') if page.url.startswith("http") \
        and "?" not in path else None
    started = time.monotonic()
    if nav is not None and nav.count():
        nav.first.click()
    else:
        page.goto(url, wait_until="domcontentloaded")
    wait_for_app(page)
    TIMES.append((path or "home", round(time.monotonic() - started, 1)))
    if charts:
        page.wait_for_selector(".js-plotly-plot .main-svg", timeout=60_000)
        page.wait_for_timeout(300)


def _shot(page, folder, name: str) -> None:
    """The whole page: Streamlit scrolls inside its main block, so the viewport grows to its height."""
    tall = page.evaluate("() => document.querySelector('[data-testid=\"stMain\"]').scrollHeight")
    page.set_viewport_size({"width": VIEWPORT["width"], "height": min(max(tall, VIEWPORT["height"]), 12000)})
    page.wait_for_timeout(400)
    page.screenshot(path=folder / f"{name}.png", timeout=120_000)
    page.set_viewport_size(VIEWPORT)
    TIMES.append((name, round(time.monotonic() - STARTED[0], 1)))


def _context(chromium):
    """A browser context at 1440x900 that waits long enough on a loaded shared machine."""
    context = chromium.new_context(viewport=VIEWPORT)
    context.set_default_timeout(90_000)
    return context


def _lens(page, name: str) -> None:
    page.locator('[data-testid="stButtonGroup"]').get_by_text(name, exact=True).first.click()


def _click(page, wait_for_app, name: str) -> None:
    page.get_by_role("button", name=name).first.click()
    wait_for_app(page)


def test_a_reader_walks_every_page(app_url, chromium, artifacts, wait_for_app):
    STARTED[0] = time.monotonic()
    folder = artifacts / "readable"
    folder.mkdir(exist_ok=True)
    context = _context(chromium)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        # Home on tiny-gpt2: the tree, a lens, a search; one alias said in the singular; one size.
        _open(page, app_url, wait_for_app, charts=True)
        page.get_by_text("Model tree").first.wait_for()
        text = _check_reads_well(page, "home")
        sidebar_size = re.search(r"([\d.]+ [KMGT]?i?B) with buffers", text)  # the sidebar and the page agree
        assert sidebar_size and f"{sidebar_size.group(1)} in all" in text
        _lens(page, "dtype")
        wait_for_app(page)
        page.get_by_label("Search modules", exact=True).and_(page.locator("input")).fill("lm_head")
        page.get_by_label("Search modules", exact=True).and_(page.locator("input")).press("Enter")
        wait_for_app(page)
        assert page.get_by_role("link", name=re.compile("Alias graph")).count() >= 1
        _check_reads_well(page, "home, lens dtype, search lm_head")
        _shot(page, folder, "1-home-tree")

        # Alias graph: run the conversion check.
        _open(page, f"{app_url}/Alias_graph", wait_for_app, charts=True)
        _click(page, wait_for_app, "Run conversion check")
        _check_reads_well(page, "alias graph")
        _shot(page, folder, "2-alias-graph")

        # Flatten map: one backward pass; its gradients then colour the home tree.
        _open(page, f"{app_url}/Flatten_map", wait_for_app, charts=True)
        _click(page, wait_for_app, "Run a backward pass")
        page.wait_for_selector(".js-plotly-plot", timeout=60_000)
        _check_reads_well(page, "flatten map")
        _shot(page, folder, "3-flatten-map")

        # Device map: the decisions, in binary units; the dispatch button says why it is off.
        _open(page, f"{app_url}/Device_map", wait_for_app, charts=True)
        text = _check_reads_well(page, "device map")
        assert "KiB" in text
        page.get_by_role("tab", name="Bytes per device").click()
        page.wait_for_timeout(500)
        _check_reads_well(page, "device map, bytes per device")
        _shot(page, folder, "4-device-map")

        # Hook captures: capture again; the copy-vs-reference figure says when all values are 0.
        _open(page, f"{app_url}/Hook_captures", wait_for_app, charts=True)
        _click(page, wait_for_app, "Capture again")
        _check_reads_well(page, "hook captures")
        _shot(page, folder, "5-hook-captures")

        # Attributions: computed at once on a small model; time left is never "of about".
        _open(page, f"{app_url}/Attributions", wait_for_app, charts=True)
        text = _check_reads_well(page, "attributions")
        assert "of about" not in text
        _shot(page, folder, "6-attributions")

        # Report: build it; it names the page's controls, never library arguments.
        _open(page, f"{app_url}/Report", wait_for_app)
        _click(page, wait_for_app, "Build report")
        page.get_by_text("Download").first.wait_for(timeout=120_000)
        text = _check_reads_well(page, "report")
        for api in ("backward=True", "conversion_max_bytes", "attribution_cpu_max_bytes", "Module.cuda() |"):
            assert api not in text, api
        _shot(page, folder, "7-report")

        # Labs: an empty answer is not an attempt.
        _open(page, f"{app_url}/Labs", wait_for_app)
        page.get_by_role("button", name="Check").first.click()
        wait_for_app(page)
        text = _check_reads_well(page, "labs")
        assert "Give an answer first" in text and "Attempts" not in text
        _shot(page, folder, "8-labs")

        # Back home: the gradient-norm lens now has this session's gradients.
        _open(page, app_url, wait_for_app, charts=True)
        _lens(page, "gradient norm")
        wait_for_app(page)
        text = _check_reads_well(page, "home, gradient norm")
        assert "No gradients in this session yet" not in text
        _shot(page, folder, "9-home-gradients")
        assert errors == []
        print("seconds:", TIMES)
    finally:
        _shot(page, folder, "last")
        context.close()

    # A 70-billion-parameter model on meta: the tree stays quick and every size reads in GiB;
    # a bad link's model is named on the page itself.
    context = _context(chromium)
    page = context.new_page()
    try:
        _open(page, f"{app_url}/?model=sample:llama-70b-meta&device=meta", wait_for_app, charts=True)
        text = _check_reads_well(page, "home, llama-70b-meta")
        assert "69.0 billion" in text and "GiB" in text
        _shot(page, folder, "10-home-llama-70b")
        _open(page, f"{app_url}/Device_map", wait_for_app, charts=True)
        page.get_by_role("tab", name="Bytes per device").click()
        page.wait_for_timeout(500)
        _check_reads_well(page, "device map, llama-70b-meta")
        _shot(page, folder, "11-device-map-llama-70b")
    finally:
        context.close()
        print("seconds:", TIMES[-4:])
    context = _context(chromium)
    page = context.new_page()
    try:
        _open(page, f"{app_url}/?sample=no-such-model", wait_for_app)
        main = page.locator('[data-testid="stMain"]').inner_text()
        assert "The link asked for" in main and "no-such-model" in main
        _shot(page, folder, "12-bad-link")
    finally:
        context.close()
