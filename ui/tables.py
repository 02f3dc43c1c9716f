"""Tables that stay fast on big models: a text filter and pages, never thousands of rows at once."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import streamlit as st

from inspector.findings import Finding, sort_findings

PAGE_SIZE = 50
SEVERITY_BADGE = {"error": "red", "warning": "orange", "info": "blue"}


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
        left, right = st.columns([3, 1])
        text = left.text_input("Filter", key=f"{key}_filter", placeholder="part of a name, dtype, device…",
                               label_visibility="collapsed")
        shown = filter_rows(df, text, filter_columns)
        pages = max(1, math.ceil(len(shown) / page_size))
        page = right.number_input(f"Page (of {pages})", min_value=1, max_value=pages, value=1, step=1,
                                  key=f"{key}_page_{pages}", label_visibility="collapsed")
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
    st.dataframe(view, hide_index=True, width="stretch", **dataframe_kwargs)
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
    paged_table(findings_frame(findings), key, page_size=20,
                column_config={"message": st.column_config.TextColumn(width="large")})


def tensor_listing(model) -> pd.DataFrame:
    """Every parameter and buffer name (aliases included) with its shape, dtype and device.

    Metadata only, so it works on the meta device. ``same_as`` names the first name of the
    same object when a name is an alias.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> list(tensor_listing(m)["same_as"])
    ['', '0.weight']
    """
    rows, first = [], {}
    for kind, items in (("parameter", model.named_parameters(remove_duplicate=False)),
                        ("buffer", model.named_buffers(remove_duplicate=False))):
        for name, t in items:
            owner = first.setdefault(id(t), name)
            rows.append({"name": name, "kind": kind, "shape": str(tuple(t.shape)),
                         "numel": t.numel(), "dtype": str(t.dtype).removeprefix("torch."),
                         "device": str(t.device),
                         "requires_grad": bool(t.requires_grad) if kind == "parameter" else None,
                         "same_as": "" if owner == name else owner})
    return pd.DataFrame(rows, columns=["name", "kind", "shape", "numel", "dtype", "device",
                                       "requires_grad", "same_as"])
