"""Every page in pages/ renders on the default model (tiny-gpt2 on the CPU) with no exception.

The list of pages is read when the tests are collected, so a new page is tested as soon as
it exists. Pages that draw charts on first render must show at least one plotly chart.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.apptest import run_page

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "pages").glob("*.py"))
# Pages that draw a chart as soon as they open on the default model.
CHART_PAGES = {"1_Alias_graph.py", "2_Flatten_map.py", "3_Device_map.py", "4_Hook_captures.py",
               "5_Attributions.py"}


def _run(page: Path) -> AppTest:
    return AppTest.from_file(str(page), default_timeout=120).run()


# Pages that use no picked model: each lab brings its own, and the sidebar names it instead.
OWN_MODEL = {"7_Labs.py"}


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_renders_on_default_model(page: Path):
    at = _run(page)
    assert not at.exception, [e.value for e in at.exception]
    if page.name in OWN_MODEL:
        assert "mi_selection" not in at.session_state  # no picker: the default model is not loaded
    else:
        assert at.session_state["mi_selection"].key == "sample:tiny-gpt2|None|cpu|None"
        # The sidebar picker is there on every page (pages run on their own), and says the model is loaded.
        load = at.button(key="mi_load")
        assert (load.label, load.disabled) == ("Loaded", True)
    if page.name in CHART_PAGES:
        assert len(at.get("plotly_chart")) >= 1, f"{page.name} drew no plotly chart"
    # A warm rerun works too (cached analyses, same widgets).
    at.run()
    assert not at.exception


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_page_renders_on_meta_model(page: Path):
    """Structure-only models: pages either show their structure views or explain, never crash."""
    at = run_page(page.name, timeout=120, query={"model": "sample:llama-70b-meta", "device": "meta"})
    assert not at.exception, [e.value for e in at.exception]
    if page.name not in OWN_MODEL:
        assert at.session_state["mi_selection"].device == "meta"


def test_pages_are_found():
    assert (ROOT / "app.py").is_file()
    assert all(p.suffix == ".py" for p in PAGES)


CAPTURE_PAGE = ROOT / "pages" / "4_Hook_captures.py"


def _wte_shape(at: AppTest) -> str:
    stats = next(df.value for df in at.dataframe if {"module", "shape"} <= set(df.value.columns))
    return stats.loc[stats["module"] == "transformer.wte", "shape"].iloc[0]


@pytest.mark.skipif(not CAPTURE_PAGE.is_file(), reason="needs the Hook captures page")
def test_two_sessions_capture_on_one_model_and_see_only_their_own():
    """Two sessions share the cached tiny-gpt2 object but keep their own captures."""
    from ui.models import Selection, get_loaded

    model = get_loaded(Selection()).model
    a = AppTest.from_file(str(CAPTURE_PAGE), default_timeout=120).run()
    b = AppTest.from_file(str(CAPTURE_PAGE), default_timeout=120).run()
    a.slider(key="cap_batch").set_value(1).run()
    b.slider(key="cap_batch").set_value(4).run()
    assert not a.exception and not b.exception
    # tiny-gpt2: the token embedding outputs (batch, 16 positions, width 16).
    assert _wte_shape(a) == "(1, 16, 16)"
    assert _wte_shape(b) == "(4, 16, 16)"
    a.run()  # after b captured on the same model object, a still shows its own capture
    assert _wte_shape(a) == "(1, 16, 16)"
    assert get_loaded(Selection()).model is model
    # No hook outlives a capture on the shared model.
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
