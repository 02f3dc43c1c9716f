"""Tables that stay fast on big models: a text filter and pages, never thousands of rows at once."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import streamlit as st

from inspector import Finding, format_bytes, sort_findings
from inspector.utils import grid_frame

PAGE_SIZE = 50
SEVERITY_BADGE = {"error": "red", "warning": "orange", "info": "blue"}
CHAR_PX = 8        # width of one character of the grid's 14 px font, rounded up
CELL_PAD_PX = 30   # cell padding plus room for the sort arrow in the header
MAX_FIT_PX = 480   # wider text columns scroll inside their cell rather than push the table
MESSAGE_PX = 560   # width of a findings message column
MAX_WORD_PX = 300  # a narrowed text column keeps room for a word up to this wide (a module name)
LINE_PX = 21       # one wrapped line of grid text
TABLE_PX = 940     # a table wider than this (a wide page at 1440 px) hides its right-hand columns
NAMED_PX = {"small": 75, "medium": 200, "large": 400}  # the grid's named column widths


def cell_text(value) -> str:
    """How the grid writes a value (numbers with thousands separators, as the columns are formatted)."""
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return "" if math.isnan(value) else f"{value:,.4g}" if abs(value) < 1e6 else f"{value:,.0f}"
    return str(value)


def fit_columns(df: pd.DataFrame, column_config: dict | None = None) -> dict:
    """Column settings that make every column wide enough for its header and its widest value.

    Integer columns show thousands separators (``68,976,648,192``) and are never clipped;
    text columns are fitted up to ``MAX_FIT_PX``. Settings given in ``column_config`` win;
    a width is only added where none was given.

    >>> cfg = fit_columns(pd.DataFrame({"elements": [68_976_648_192]}))
    >>> cfg["elements"]["width"] >= len("68,976,648,192") * CHAR_PX, cfg["elements"]["type_config"]["format"]
    (True, 'localized')
    """
    out = dict(column_config or {})
    text_cols: dict[str, int] = {}  # text columns fitted here -> the width their header needs
    for col in df.columns:
        given = out.get(col)
        if isinstance(given, dict) and given.get("width") is not None or given is None and col in out:
            continue
        values = df[col]
        is_int = pd.api.types.is_integer_dtype(values) and not pd.api.types.is_bool_dtype(values)
        header = given.get("label") if isinstance(given, dict) and given.get("label") else col
        texts = [cell_text(v) for v in values.head(500)]
        widest = max([len(str(header)), *map(len, texts)])
        px = widest * CHAR_PX + CELL_PAD_PX
        if not is_int:
            px = min(px, MAX_FIT_PX)
            word = max([len(str(header)), *(len(w) for t in texts for w in t.split())])  # a word never breaks
            text_cols[col] = min(px, word * CHAR_PX + CELL_PAD_PX, MAX_WORD_PX)
        if isinstance(given, dict):
            out[col] = {**given, "width": px}
        elif is_int:
            out[col] = st.column_config.NumberColumn(width=px, format="localized")
        else:
            out[col] = st.column_config.Column(width=px)
    return _fit_table(out, text_cols, next(iter(df.columns), None))


def _fit_table(config: dict, text_cols: dict[str, int], first: object = None) -> dict:
    """Narrow the wide text columns (never below their header or their longest word, never ``first``,
    the table's first column, which names each row) until the table fits ``TABLE_PX``, so that the
    columns on the right are not pushed out of sight; :func:`wrap_height` gives their text the lines
    it then needs."""
    widths = {c: cfg.get("width") for c, cfg in config.items() if isinstance(cfg, dict)}
    total = sum(w for w in widths.values() if isinstance(w, int))
    give = {c: widths[c] - max(floor, 120) for c, floor in text_cols.items()
            if c != first and isinstance(widths.get(c), int) and widths[c] > max(floor, 120)}
    extra = total - TABLE_PX
    if extra <= 0 or not give:
        return config
    share = min(1.0, extra / sum(give.values()))
    for c, room in give.items():
        config[c] = {**config[c], "width": int(widths[c] - room * share)}
    return config


def is_bytes_column(name: object) -> bool:
    """Columns that hold byte counts: ``bytes``, ``nbytes``, ``total_bytes``, ``bytes_on_0``…"""
    text = str(name)
    return text in ("bytes", "nbytes") or text.endswith("_bytes") or text.startswith("bytes_")


def human_bytes(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` with every numeric bytes column written in binary units (``144.5 GiB``), as people read them.

    >>> human_bytes(pd.DataFrame({"name": ["w"], "bytes": [155_171_243_763]}))["bytes"].tolist()
    ['144.5 GiB']
    """
    cols = [c for c in df.columns if is_bytes_column(c) and pd.api.types.is_numeric_dtype(df[c])
            and not pd.api.types.is_bool_dtype(df[c])]
    if not cols:
        return df
    return df.assign(**{str(c): df[c].map(format_bytes) for c in cols})


DEVICE_COLUMNS = ("device", "ours", "accelerate")
TINY = 1e-9  # a float this much smaller than its column's largest value is rounding noise


def plain_cells(df: pd.DataFrame) -> pd.DataFrame:
    """Cells as people read them: empty where a text column holds None or NaN (or their text), a
    device number as ``1`` (not ``1.0``), and float noise (``-6e-10`` beside values near 1) as 0.

    >>> plain_cells(pd.DataFrame({"device": ["1.0", None, "cpu"], "x": [1.0, -6e-10, 0.5]})).values.tolist()
    [['1', 1.0], ['', 0.0], ['cpu', 0.5]]
    """
    out = df.copy()
    for col in out.columns:
        values = out[col]
        devices = any(str(col).startswith(d) or str(col).endswith(d) for d in DEVICE_COLUMNS)
        if pd.api.types.is_float_dtype(values) and not devices:
            top = values.abs().max()
            if top == top and top > 0:
                out[col] = values.where(~(values.abs() < top * TINY), 0.0)
            continue
        if not (values.dtype == object or pd.api.types.is_string_dtype(values) or devices):
            continue
        cells = [_plain(v, devices) for v in values]
        if any(isinstance(v, (bool, np.bool_)) for v in cells):  # True/False beside blanks: all as text
            cells = [str(bool(v)) if isinstance(v, (bool, np.bool_)) else v for v in cells]  # ('' is no bool)
        out[col] = pd.Series(cells, index=out.index, dtype=object)
    return out


def _plain(value, device: bool):
    if value is None or isinstance(value, float) and value != value or value in ("None", "nan"):
        return ""
    if device and isinstance(value, float) and value.is_integer():
        return str(int(value))
    if device and isinstance(value, str) and value.endswith(".0") and value[:-2].isdigit():
        return value[:-2]
    return value


def show_frame(df: pd.DataFrame, column_config: dict | None = None, *, more_key: str | None = None,
               first: Sequence[str] = (), **kwargs) -> None:
    """``st.dataframe`` with bytes in binary units, plain cells (:func:`plain_cells`) and every column
    fitted to its content (see :func:`fit_columns`).

    With ``more_key``, a table wider than ``TABLE_PX`` shows the columns that fit (``first`` ones
    first, then the frame's order) and a "More columns" toggle (that key) for the rest.
    """
    kwargs.setdefault("hide_index", True)
    kwargs.setdefault("width", "stretch")
    df = grid_frame(plain_cells(human_bytes(df)))  # names with line breaks or RTL overrides show as escapes
    config = fit_columns(df, column_config)
    given = list(kwargs.get("column_order") or df.columns)
    order = fitting_columns(given, config, first) if more_key is not None else given
    if len(order) < len(given):
        hidden = [str(c) for c in given if c not in order]
        names = ", ".join(hidden[:4]) + (", …" if len(hidden) > 4 else "")
        if not st.toggle(f"More columns ({len(hidden)} more: {names})", key=more_key,
                         help="The table then scrolls sideways."):
            kwargs["column_order"] = order
            config = {c: v for c, v in config.items() if c in order}
    if kwargs.get("row_height") is None:
        kwargs["row_height"] = wrap_height(df, config)
    st.dataframe(df, column_config=config, **kwargs)


def fitting_columns(columns: Sequence, config: dict, first: Sequence[str] = ()) -> list:
    """The ``columns`` that fit ``TABLE_PX`` side by side, at the widths of ``config``: the ``first``
    ones, then the rest in their order, while they fit (the first column always).

    >>> fitting_columns(["a", "b", "c"], {"a": {"width": 500}, "b": {"width": 500}, "c": {"width": 400}},
    ...                 first=["c"])
    ['c', 'a']
    """
    ranked = [c for c in first if c in columns] + [c for c in columns if c not in first]
    out, used = [], 0
    for col in ranked:
        cfg = config.get(col)
        width = cfg.get("width") if isinstance(cfg, dict) else None
        px = NAMED_PX.get(width, width) if isinstance(width, str) else width
        px = px if isinstance(px, int) else 200
        if out and used + px > TABLE_PX:
            continue
        out.append(col)
        used += px
    return out


def wrap_height(df: pd.DataFrame, config: dict, max_lines: int = 4) -> int | None:
    """The row height that lets each text column's longest cell wrap onto the lines its width needs
    (at most ``max_lines``); None when every cell fits on one line.

    >>> wrap_height(pd.DataFrame({"why": ["merged 2 keys into 1 where a whole module sits on one device"]}),
    ...             {"why": {"width": 300}})
    66
    """
    lines = 1
    for col, cfg in config.items():
        width = cfg.get("width") if isinstance(cfg, dict) else None
        if col not in df.columns or not isinstance(width, int) or pd.api.types.is_numeric_dtype(df[col]):
            continue
        longest = max((len(cell_text(v)) for v in df[col].head(500)), default=0)
        lines = max(lines, math.ceil(longest * CHAR_PX / max(1, width - CELL_PAD_PX)))
    return None if lines <= 1 else max(66, min(lines, max_lines) * LINE_PX + 10)


def filter_rows(df: pd.DataFrame, text: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
    """Rows where any of ``columns`` (default: the text columns) contains ``text``, ignoring case.

    >>> df = pd.DataFrame({"name": ["h.0.attn", "h.0.mlp", "wte"], "numel": [1, 2, 3]})
    >>> list(filter_rows(df, "MLP")["name"])
    ['h.0.mlp']
    """
    text = text.strip().lower()
    if not text or df.empty:
        return df
    cols = list(columns) if columns else [c for c in df.columns if df[c].dtype == object
                                           or pd.api.types.is_string_dtype(df[c])]
    mask = pd.Series(False, index=df.index)
    for c in cols:
        mask |= df[c].astype(str).str.lower().str.contains(text, regex=False, na=False)
    return df[mask]


def paged_table(df: pd.DataFrame, key: str, *, page_size: int = PAGE_SIZE,
                filter_columns: Sequence[str] | None = None, caption: str = "",
                **dataframe_kwargs) -> pd.DataFrame:
    """Show ``df`` with a filter box and pages of ``page_size`` rows; returns the filtered frame.

    ``key`` must be unique on the page (it names the filter and page widgets).
    """
    if len(df) > page_size:
        left, right = st.columns([3, 1], vertical_alignment="bottom")
        text = left.text_input(
            "Filter rows", key=f"{key}_filter", placeholder="part of a name, dtype, device…"
        )
        shown = filter_rows(df, text, filter_columns)
        pages = max(1, math.ceil(len(shown) / page_size))
        page = right.number_input(f"Page (1 to {pages})", min_value=1, max_value=pages, value=1, step=1,
                                  key=f"{key}_page_{pages}")
        start = (int(page) - 1) * page_size
        st.caption(f"{caption + ' · ' if caption else ''}rows {start + 1 if len(shown) else 0}–"
                   f"{min(start + page_size, len(shown))} of {len(shown):,}"
                   + (f" (filtered from {len(df):,})" if len(shown) != len(df) else "")
                   + f" · page {int(page)} of {pages}")
        view = shown.iloc[start:start + page_size]
    else:
        shown = view = df
        if caption:
            st.caption(caption)
    dataframe_kwargs.setdefault("more_key", f"{key}_more")
    show_frame(view, **dataframe_kwargs)
    return shown


def findings_frame(findings: list[Finding]) -> pd.DataFrame:
    """Findings most severe first, as a table."""
    rows = [f.to_dict() for f in sort_findings(findings)]
    return pd.DataFrame(rows, columns=["severity", "code", "where", "message"])


def findings_table(findings: list[Finding], key: str, *, empty: str = "Nothing to report.") -> None:
    """Findings most severe first: counts per severity, then a filterable, paged table."""
    if not findings:
        st.success(empty)
        return
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITY_BADGE}
    st.markdown(" ".join(f":{SEVERITY_BADGE[s]}-badge[{n} {s}{'s' if n != 1 else ''}]"
                         for s, n in counts.items() if n))
    frame = findings_frame(findings)
    paged_table(frame, key, page_size=20, **message_layout(frame))


def message_layout(frame: pd.DataFrame, column_config: dict | None = None) -> dict:
    """Table settings that show each ``message`` whole: wrapped in the room the other columns (fitted
    to their text) leave of ``TABLE_PX``, between two thirds of ``MESSAGE_PX`` and ``MESSAGE_PX``."""
    longest = int(frame["message"].astype(str).str.len().max()) if len(frame) else 0
    others = fit_columns(frame.drop(columns=["message"], errors="ignore"), column_config)
    used = sum(c["width"] if isinstance(c.get("width"), int) else 200 for c in others.values()
               if isinstance(c, dict))
    width = max(MESSAGE_PX * 2 // 3, min(MESSAGE_PX, TABLE_PX - used))
    return {"row_height": message_row_height(longest, width),
            "column_config": {**(column_config or {}), "message": st.column_config.TextColumn(width=width)}}


def message_row_height(longest: int, width: int = MESSAGE_PX) -> int | None:
    """A row height that shows a message of ``longest`` characters whole (None: one line is enough).

    The grid wraps text only in rows taller than 4rem (64 px), so a wrapping row is at least 66 px.

    >>> message_row_height(40), message_row_height(300)
    (None, 115)
    """
    per_line = (width - 16) // 8  # about 7 px per character, and room for wrapping at word ends
    lines = math.ceil(longest / per_line)
    return None if lines <= 1 else max(66, lines * LINE_PX + 10)
