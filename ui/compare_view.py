"""The Compare page's tables in words: tensors with blank cells where a side lacks the tensor, and
the two-run tables with their differences named."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

TEXT_COLUMNS = ("name_b", "dtype_a", "dtype_b", "device_a", "device_b")
RELATIVE = "%.4g"


def tensor_rows(tensors: pd.DataFrame) -> pd.DataFrame:
    """The tensor table for people: shapes as ``(32, 16)``, and an empty cell (not "None") where
    a side does not hold the tensor."""
    out = tensors.copy()
    for col in ("shape_a", "shape_b"):
        out[col] = ["" if v is None or (isinstance(v, float) and v != v) else str(tuple(v)) for v in out[col]]
    for col in TEXT_COLUMNS:
        out[col] = out[col].astype(object).where(out[col].notna(), "")
    return out


def run_module_config() -> dict[str, Any]:
    """Column names in words for the per-module table of two runs (short: the table must fit the page,
    or the grid leaves its last columns blank; the help says the rest)."""
    rel = "relative difference of the module's gradient norm, |B−A| / max(|A|, |B|)"
    return {
        "first_divergence": st.column_config.NumberColumn(
            "first step beyond", format="%d", help="the first step its difference passes the tolerance"
        ),
        "max_diff": st.column_config.NumberColumn(
            "largest rel. diff", format=RELATIVE, help=f"the largest {rel}"
        ),
        "diff_at_divergence": st.column_config.NumberColumn(
            "rel. diff at divergence", format=RELATIVE, help=f"the {rel} at the first divergence"
        ),
    }


def run_step_config(steps: pd.DataFrame) -> dict[str, Any]:
    """Column names in words for the per-step table of two runs: ``loss_a`` is "loss A",
    ``loss_diff`` "loss rel. diff" (|B−A| / max(|A|, |B|))."""
    config: dict[str, Any] = {}
    for col in steps.columns:
        what, _, side = col.rpartition("_")
        if not what:
            continue
        words = what.replace("_", " ")
        if side == "diff":
            config[col] = st.column_config.NumberColumn(f"{words} rel. diff", format=RELATIVE,
                                                        help=f"|B−A| / max(|A|, |B|) of the {words}")
        else:
            config[col] = st.column_config.NumberColumn(f"{words} {side.upper()}", format=RELATIVE)
    return config
