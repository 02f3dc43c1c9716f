"""The Alias graph page: groups, graph, disjoint views, conversion check and re-tie buttons."""

from __future__ import annotations

from pathlib import Path

import torch
from streamlit.testing.v1 import AppTest

from tests.apptest import run_page

PAGE = str(Path(__file__).resolve().parent.parent / "pages" / "1_Alias_graph.py")


def _table(at: AppTest, column: str):
    for df in at.dataframe:
        if column in df.value.columns:
            return df.value
    raise AssertionError(f"no table with a {column!r} column")


def test_alias_page_groups_graph_conversions_and_retie():
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception, [e.value for e in at.exception]
    groups = _table(at, "kind")
    assert groups[["names", "kind"]].values.tolist() == [
        ["transformer.wte.weight, lm_head.weight", "same-object"]]
    assert [m.value for m in at.metric][2:] == ["4,080", "4,592"]  # exact below a million
    assert len(at.get("plotly_chart")) == 1

    at.multiselect(key="aliases_conversions").set_value(["to-float64-overwrite", "to-float32-overwrite",
                                                         "move-model-float64"])
    at.button(key="aliases_check").click().run()
    assert not at.exception, [e.value for e in at.exception]
    table = _table(at, "same_storage")
    assert table[["outcome", "same_object", "same_storage", "unique"]].values.tolist() == [
        ["-", True, True, 4080],
        ["broken", False, False, 4592],
        ["weakened", False, True, 4592],
        ["kept", True, True, 4080],
    ]
    # the outcomes again, with Material icons rather than emoji (which need an emoji font)
    line = next(m.value for m in at.markdown if ":material/link_off: broken" in m.value)
    assert ":material/check_circle: kept" in line and ":material/warning: weakened" in line
    assert torch.__future__.get_overwrite_module_params_on_conversion() is False

    at.button(key="aliases_retie").click().run()
    assert not at.exception, [e.value for e in at.exception]
    table = _table(at, "same_storage")
    retied = table[table["conversion"].str.endswith("+ retie")]
    assert retied[["outcome", "unique"]].values.tolist() == [["kept", 4080], ["kept", 4080]]
    assert any("4,592 → 4,080 after re-tie" in s.value for s in at.success)
    codes = set(_table(at, "code")["code"])
    assert codes == {"tie-broken", "tie-weakened", "tie-restored"}


def test_alias_page_on_meta_model_says_identity_only():
    at = run_page("1_Alias_graph.py", query={"model": "sample:llama-70b-meta", "device": "meta"})
    assert any("meta device" in i.value for i in at.info)
    assert any("No two names share" in s.value for s in at.success)
    at.button(key="aliases_check").click().run()
    assert not at.exception
    table = _table(at, "same_storage")
    # no ties to break; dtype conversions run on meta copies without allocating memory
    assert table["outcome"].tolist() == ["-"] + ["no ties"] * 4
    assert set(table["unique"]) == {68976648192}
    at.multiselect(key="aliases_conversions").set_value(["to-empty"])
    at.button(key="aliases_check").click().run()
    assert not at.exception
    table = _table(at, "error")
    assert "GiB" in table["error"].tolist()[1]  # to_empty onto the CPU would need ~257 GiB: refused
