"""The Device map page: budget, our plan vs accelerate's, treemap, findings, records, placement."""

from __future__ import annotations

from pathlib import Path

import torch
from streamlit.testing.v1 import AppTest

from ui.models import Selection

PAGE = str(Path(__file__).resolve().parent.parent / "pages" / "3_Device_map.py")


def _page(source: str, device: str = "cpu") -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.session_state["mi_selection"] = Selection(source=source, device=device)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def _table(at: AppTest, column: str):
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no table with a {column!r} column")


def test_split_block_page_flags_accelerates_missing_buffers():
    at = _page("sample:split-block")
    # default budget: 0 = 55% of 72992 + 16640 (one Linear) = 56785, 1 = 40145, cpu = 145984
    assert [m.value for m in at.metric] == ["7 / 5", "2", "passes", "fails"]
    assert any("block.scale, block.pos_table" in e.value for e in at.error)
    diff = _table(at, "accelerate_finding")
    # everything fits the two GPUs, so ours reserves nothing and keeps fc2 on 0; accelerate
    # keeps one Linear free on 0 and moves fc2 to 1
    assert diff["name"].tolist() == ["block.scale", "block.pos_table", "block.fc2.weight", "block.fc2.bias"]
    assert diff["accelerate_finding"].tolist()[:2] == ["buffer-unplaced"] * 2
    records = _table(at, "reason")
    assert {"budget", "place", "split", "buffer", "clean"} <= set(records["step"])
    assert len(at.get("plotly_chart")) >= 4
    budgets = at.dataframe[0].value if "budget" in at.dataframe[0].value.columns else None
    assert budgets is None or all(b.endswith("iB") or b.endswith(" B") for b in budgets["budget"])
    if not torch.cuda.is_available():  # the dispatch button says why it is off, on the page
        assert at.button(key="dm_dispatch").disabled
        assert any("does not have (GPU 0, GPU 1)" in i.value for i in at.info)

    at.radio(key="dm_tree_which").set_value("accelerate's plan").run()
    assert not at.exception, [e.value for e in at.exception]

    # audit a JSON map typed in: "nope" names nothing, "block" on 1 keeps its buffers with it
    at.text_area(key="dm_json_sample:split-block").set_value(
        '{"embed": 0, "block": 1, "head": "cpu", "nope": 2}'
    ).run()
    assert not at.exception, [e.value for e in at.exception]
    codes = {c for df in at.dataframe if "code" in df.value.columns for c in df.value["code"]}
    assert {"unknown-key", "buffer-unplaced", "split-owner"} <= codes


def test_dispatch_button_on_a_cpu_disk_budget():
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.session_state["mi_selection"] = Selection(source="sample:split-block")
    at.run()
    editor_key = "dm_budget_sample:split-block"
    # replace the suggested budget with cpu=76000, disk=1GiB (see tests/test_placement.py)
    at.session_state[editor_key] = {"edited_rows": {0: {"device": "cpu", "budget": "76000"},
                                                    1: {"device": "disk", "budget": "1GiB"}},
                                    "added_rows": [], "deleted_rows": [2]}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.button(key="dm_dispatch").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("exactly the same outputs" in s.value for s in at.success)


def test_bad_budget_shows_an_error_and_the_page_survives():
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.session_state["mi_selection"] = Selection(source="sample:split-block")
    at.session_state["dm_budget_sample:split-block"] = {
        "edited_rows": {0: {"device": "tpu"}}, "added_rows": [], "deleted_rows": []}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("unknown device 'tpu'" in e.value for e in at.error)


def test_llama_meta_page():
    at = _page("sample:llama-70b-meta", "meta")
    assert at.metric[2].value == "passes"
    assert not at.exception
