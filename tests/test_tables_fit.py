"""The data grids of the pages at 1400 px: the grid draws on a canvas, so a browser cannot read its cells;
here each column's width, as the page sets it, is checked against the text of its cells (a cell
wider than its column is cut off), and each table against the width of the page's main column."""

from __future__ import annotations

import json

import pytest

from tests.apptest import run_page
from ui.tables import CELL_PAD_PX, CHAR_PX, LINE_PX, TABLE_PX, cell_text

NAMED = {"small": 75, "medium": 200, "large": 400}


def _fits(text: str, width: int, lines: int) -> bool:
    """Whether ``text`` fits a column ``width`` px wide on ``lines`` lines (wrapped at spaces; a word
    never breaks), a few px of slack allowed for narrow glyphs."""
    room = width - CELL_PAD_PX + 12
    if lines == 1 or not text.strip():
        return len(text) * CHAR_PX <= room
    return max(len(w) for w in text.split()) * CHAR_PX <= room and len(text) * CHAR_PX <= lines * room


def _cut_cells(at, whole_tables: bool = True) -> list[str]:
    """``table: column: text`` for every cell wider than the width its column was given (on the lines its
    row height allows), and, with ``whole_tables``, every table whose columns add up to more than the
    page's main column."""
    out = []
    for i, grid in enumerate(at.dataframe):
        config = json.loads(grid.proto.columns or "{}")
        frame = grid.value
        lines = max(1, (grid.proto.row_height - 10) // LINE_PX) if grid.proto.row_height else 1
        total = 0
        shown = list(grid.proto.column_order) or [str(c) for c in frame.columns]  # a column hidden: no room
        for col in [c for c in frame.columns if str(c) in shown]:
            given = config.get(str(col), {})
            width = NAMED.get(given.get("width"), given.get("width"))
            if not isinstance(width, int):
                continue
            total += width
            label = given.get("label") or str(col)
            numeric = given.get("type_config", {}).get("type") == "number"
            for text in [label, *(cell_text(v) for v in frame[col].head(50))]:
                if not _fits(text, width, 1 if numeric or text == label else lines):
                    out.append(f"table {i}: {label}: {text[:60]!r} needs {len(text) * CHAR_PX + CELL_PAD_PX} "
                               f"px, has {width} ({lines} line(s))")
                    break
        if whole_tables and total > TABLE_PX + 10:
            out.append(f"table {i}: its columns take {total} px of {TABLE_PX}")
    return out


@pytest.fixture
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("INSPECTOR_RUNS", str(tmp_path))
    from inspector.watching import synthetic_run
    from tests.e2e.test_fit_browser import _nan_run

    _nan_run(tmp_path / "nan.inspect")
    synthetic_run(tmp_path / "long.inspect", steps=10_000, modules=20, chunk=2_000)
    return tmp_path


def test_the_training_tables_fit(runs):
    at = run_page("8_Training.py", query={"run": str(runs / "nan.inspect")})
    assert _cut_cells(at) == []
    runs_table = next(d.value for d in at.dataframe if "state" in d.value.columns)
    assert sorted(runs_table["steps"].tolist()) == [40, 10_000] and set(runs_table["state"]) == {"complete"}


def test_the_compare_tables_fit(runs):
    run = str(runs / "nan.inspect")
    at = run_page("9_Compare.py", query={"run_a": run, "run_b": run})
    at.radio(key="cmp_mode").set_value("two run files").run()
    assert not at.exception
    assert _cut_cells(at) == []


@pytest.mark.parametrize("page", ["3_Device_map.py", "2_Flatten_map.py", "1_Alias_graph.py",
                                  "4_Hook_captures.py"])
def test_the_model_pages_tables_fit(page):
    at = run_page(page, source="sample:tiny-gpt2")
    assert _cut_cells(at) == []
    assert any(t.label.startswith("More columns") for t in at.toggle)  # each page has a table too wide


def test_more_columns_shows_every_column():
    at = run_page("4_Hook_captures.py", source="sample:tiny-gpt2")
    stats = next(d for d in at.dataframe if "zero_fraction" in d.value.columns)
    shown = list(stats.proto.column_order)
    assert shown[:3] == ["module", "kind", "shape"] and "mutated" not in shown  # 14 columns do not fit
    at.toggle(key="cap_stats_more").set_value(True).run()
    stats = next(d for d in at.dataframe if "zero_fraction" in d.value.columns)
    assert set(stats.proto.column_order) == set(stats.value.columns) - {"path"}  # all but the empty one
    assert _cut_cells(at, whole_tables=False) == []
