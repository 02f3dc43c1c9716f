"""The Compare page of a LoRA-merged checkpoint in Chromium at 1400×1000: the first screen names the one
tensor the merge changed, with its rank and the ``low-rank-update`` message (no "More columns" opened),
and the chart's legend shows the colour its changed bars are drawn in."""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest

pytestmark = pytest.mark.e2e

VIEWPORT = {"width": 1400, "height": 1000}
MERGED = "transformer.h.0.attn.c_attn.weight"
MAIN = '[data-testid="stMain"]'
LEGEND_FILL = """name => {
    const item = [...document.querySelectorAll('.js-plotly-plot g.legend g.traces')]
        .find(g => g.textContent.trim() === name);
    const mark = item && item.querySelector('g.legendpoints path');
    return mark ? getComputedStyle(mark).fill : null;
}"""
BAR_FILLS = """() => [...document.querySelectorAll('.js-plotly-plot g.trace.bars g.point path')]
    .map(p => getComputedStyle(p).fill)"""


def _checkpoints(folder):
    """tiny-gpt2's tensors, moved a little (the base), and the base with a rank-2 adapter merged into
    the attention's input projection (48 × 16 += (48 × 2) @ (2 × 16))."""
    import torch
    from safetensors.torch import save_file

    from inspector import load_model

    torch.manual_seed(0)
    state = load_model("sample:tiny-gpt2").model.state_dict()
    base = {k: (v + 0.01 * torch.randn_like(v)).contiguous() for k, v in state.items()
            if k != "lm_head.weight"}  # tied to the embedding: safetensors stores the tie once
    merged = dict(base)
    merged[MERGED] = base[MERGED] + 0.05 * torch.randn(48, 2) @ torch.randn(2, 16)
    save_file(base, str(folder / "base.safetensors"))
    save_file(merged, str(folder / "merged.safetensors"))
    return folder / "base.safetensors", folder / "merged.safetensors"


def _in_first_screen(page, locator) -> bool:
    """Whether the element lies wholly inside the window as the page opens (no scrolling)."""
    box = locator.bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= VIEWPORT["height"]


def test_a_merged_adapter_is_named_first_and_its_bars_match_the_legend(
        app_url, chromium, artifacts, wait_for_app, tmp_path):
    base, merged = _checkpoints(tmp_path)
    query = urlencode({"sample": "tiny-gpt2", "checkpoint": str(base), "b": str(merged)})
    page = chromium.new_page(viewport=VIEWPORT)
    page.set_default_timeout(120_000)
    try:
        page.goto(f"{app_url}/Compare?{query}", wait_until="domcontentloaded")
        wait_for_app(page)
        main = page.locator(MAIN)
        changed = main.get_by_text(re.compile(r"^Changed: ")).first  # not the caption's "15 unchanged: ..."
        changed.wait_for(timeout=30_000)
        page.screenshot(path=artifacts / "compare-lora.png")
        assert page.evaluate("() => window.scrollY") == 0
        assert not main.locator('[data-testid="stException"], [data-testid="stAlertContentError"]').count()
        # the one changed tensor, its change and its rank, in words on the first screen
        said = changed.inner_text()
        assert said.startswith(f"Changed: {MERGED} (‖B−A‖/‖A‖ ") and said.endswith(", rank-2 update)"), said
        assert _in_first_screen(page, changed)
        # the low-rank-update message in full, outside the findings table and its "More columns"
        message = main.locator('[data-testid="stAlertContentInfo"] [data-testid="stMarkdownContainer"]',
                               has_text="low-rank-update").first
        text = message.inner_text(timeout=30_000)
        assert text.startswith("low-rank-update: rank-2 update on 1 matrices") and MERGED in text, text
        assert "merged adapter (LoRA)" in text
        assert _in_first_screen(page, message)
        more = main.locator('[data-testid="stCheckbox"]', has_text="More columns").first.locator("input")
        assert not more.is_checked(timeout=10_000)
        # the chart (further down): the legend's "changed" mark has the colour of every changed bar
        main.locator(".js-plotly-plot").first.scroll_into_view_if_needed()
        page.wait_for_selector(".js-plotly-plot g.legend g.traces")
        legend = page.evaluate(LEGEND_FILL, "changed")
        bars = page.evaluate(BAR_FILLS)
        unchanged = page.evaluate(LEGEND_FILL, "bitwise unchanged")
        assert legend and bars, (legend, bars)
        assert set(bars) == {legend}, (legend, bars)
        assert unchanged and unchanged != legend
    finally:
        page.close()
