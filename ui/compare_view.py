"""The Compare page's tables in words: tensors with blank cells where a side lacks the tensor, and
the two-run tables with their differences named."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from inspector.utils import module_label
from inspector.watching import main_steps
from ui.paths import server_source
from ui.uploads import session_uploads

TEXT_COLUMNS = ("name_b", "dtype_a", "dtype_b", "device_a", "device_b")
RELATIVE = "%.4g"
# what changed leads: the name, then the change columns, then where the tensor lives and what it is
CHANGE_FIRST = ("name", "status", "rel_change", "max_abs", "diff_norm", "bitwise_equal", "nonfinite_a",
                "nonfinite_b", "exact_cast", "update_rank")
ONE_SIDE = "NaN/Inf on one side"


def tensor_rows(tensors: pd.DataFrame) -> pd.DataFrame:
    """The tensor table for people: what changed first (``CHANGE_FIRST``), shapes as ``(32, 16)``, and
    an empty cell (not "None") where a side does not hold the tensor."""
    out = tensors[[c for c in CHANGE_FIRST if c in tensors.columns]
                  + [c for c in tensors.columns if c not in CHANGE_FIRST]].copy()
    for col in ("shape_a", "shape_b"):
        out[col] = ["" if v is None or (isinstance(v, float) and v != v) else str(tuple(v)) for v in out[col]]
    for col in TEXT_COLUMNS:
        out[col] = out[col].astype(object).where(out[col].notna(), "")
    return out


def relative_text(values: pd.Series) -> list[str]:
    """Relative differences in words: ``0.1235``, empty where none was taken, and
    ``NaN/Inf on one side`` where one run's number was not finite (never "inf": the difference of
    two finite numbers is at most 2)."""
    return ["" if v != v else ONE_SIDE if v == float("inf") else f"{v:.4g}" for v in values]


def run_step_rows(steps: pd.DataFrame) -> pd.DataFrame:
    """The per-step table of two runs with its relative differences in words (:func:`relative_text`)."""
    diffs = [c for c in steps.columns if c.endswith("_diff")]
    return steps.assign(**{c: relative_text(steps[c].astype(float)) for c in diffs})


def run_module_rows(modules: pd.DataFrame) -> pd.DataFrame:
    """The per-module table of two runs with its relative differences in words (:func:`relative_text`)."""
    out = modules.copy()
    for col in ("max_diff", "diff_at_divergence"):
        if col in out.columns:
            out[col] = relative_text(out[col].astype(float))
    return out


def nonfinite_steps(run: Any) -> np.ndarray:
    """The steps of ``run`` (its first rank) whose gradient norm or logged loss was NaN/Inf: a NaN
    gradient norm counts where the step counted values not finite, a NaN loss where it was logged."""
    steps = main_steps(run)
    if not len(steps):
        return np.zeros(0, dtype=np.int64)
    norm = pd.to_numeric(steps["grad_norm"], errors="coerce").to_numpy(dtype=float)
    loss = pd.to_numeric(steps["loss"], errors="coerce").to_numpy(dtype=float)
    counted = pd.to_numeric(steps.get("nonfinite", 0), errors="coerce").fillna(0).to_numpy() > 0
    logged = steps["loss_logged"].fillna(False).to_numpy(dtype=bool) if "loss_logged" in steps else False
    bad = np.isinf(norm) | (np.isnan(norm) & counted) | np.isinf(loss) | (np.isnan(loss) & logged)
    return steps["step"].to_numpy()[bad]


def run_module_config() -> dict[str, Any]:
    """Column names in words for the per-module table of two runs (short: the table must fit the page,
    or the grid leaves its last columns blank; the help says the rest)."""
    rel = "relative difference of the module's gradient norm, |B−A| / max(|A|, |B|)"
    return {
        "first_divergence": st.column_config.NumberColumn(
            "first step beyond", format="%d", help="the first step its difference passes the tolerance"
        ),
        "max_diff": st.column_config.TextColumn(
            "largest rel. diff", help=f"the largest {rel} ({ONE_SIDE}: one run's number was not finite)"
        ),
        "diff_at_divergence": st.column_config.TextColumn(
            "rel. diff at divergence", help=f"the {rel} at the first divergence"
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
            config[col] = st.column_config.TextColumn(f"{words} rel. diff",
                                                      help=f"|B−A| / max(|A|, |B|) of the {words}")
        else:
            config[col] = st.column_config.NumberColumn(f"{words} {side.upper()}", format=RELATIVE)
    return config


MOST_CHANGED = 8  # the first screen names at most this many changed tensors


@dataclass(frozen=True)
class ChangedFirst:
    """What the first screen of a weight comparison says first: the changed tensors (``name``,
    ``status``, ``rel_change``, ``update_rank``; at most ``MOST_CHANGED``, largest change first), how
    many more there are, and the ``low-rank-update`` findings' messages (the rank of each update)."""

    changed: pd.DataFrame
    more: int
    low_rank: tuple[str, ...]

    def line(self) -> str:
        """``Changed: h.0.mlp.c_fc.weight (‖B−A‖/‖A‖ 0.0123, rank-1 update)`` and how many more."""
        parts = []
        rows = self.changed[["name", "status", "rel_change", "update_rank"]].itertuples(index=False)
        for name, status, rel, rank in rows:
            said = [] if status == "changed" else [str(status)]
            said += [] if rel != rel else [f"‖B−A‖/‖A‖ {rel:.4g}"]
            said += [] if rank is None or rank != rank else [f"rank-{int(rank)} update"]
            parts.append(f"{name} ({', '.join(said)})" if said else str(name))
        more = f" and {self.more:,} more" if self.more else ""
        return "Changed: " + "; ".join(parts) + more if parts else "Changed: nothing"


def changed_first(result: Any) -> ChangedFirst:
    """The changed tensors of a :class:`~inspector.comparison.WeightComparison`, largest change first,
    and its ``low-rank-update`` messages."""
    t = result.tensors
    moved = t[t["status"].isin(["changed", "dtype-changed", "nonfinite"]) | (t["bitwise_equal"] == False)]  # noqa: E712
    moved = moved.assign(rel_change=moved["rel_change"].astype(float))
    moved = moved.sort_values("rel_change", ascending=False, na_position="last", kind="stable")
    cols = ["name", "status", "rel_change", "update_rank"]
    shown = moved.reindex(columns=cols).head(MOST_CHANGED).reset_index(drop=True)
    low = tuple(f.message for f in result.findings if f.code == "low-rank-update")
    return ChangedFirst(shown, max(0, len(moved) - MOST_CHANGED), low)


def went_nonfinite(runs: tuple[Any, Any], labels: tuple[str, str] = ("A", "B")) -> list[tuple[int, str]]:
    """For each run that went non-finite, the step and where it began: the module that first produced a
    NaN/Inf (its ``nonfinite-forward`` finding), else the first ``nonfinite-*`` finding's module; the
    side that went first leads."""
    found = []
    for label, run in zip(labels, runs, strict=True):
        if run is None:
            continue
        bad = [f for f in run.findings if f.code.startswith("nonfinite-")]
        if not bad:
            continue
        step = min(f.step for f in bad)
        first = [f for f in bad if f.step == step]
        lead = next((f for f in first if f.code == "nonfinite-forward"), first[0])
        what = "produced NaN/Inf from finite inputs" if lead.code == "nonfinite-forward" else f"{lead.code}"
        found.append((step, f"{label} went non-finite at step {step:,}: {module_label(lead.where)} — {what}"))
    return sorted(found, key=lambda p: p[0])


def file_stamp(path: str) -> tuple:
    """``path`` with its modification time and size (what a cached compare of it depends on)."""
    try:
        st_ = os.stat(path)
        return (path, st_.st_mtime_ns, st_.st_size)
    except OSError:
        return (path,)


def pick_b() -> str | None:
    """B: a source typed (``?b=`` fills it) or an uploaded file, through the path gate; None when none."""
    left, right = st.columns(2)
    text = left.text_input(
        "B: a source or a path on the server",
        value=st.query_params.get("b", ""),
        key="cmp_b",
        placeholder="sample:tiny-gpt2, hf:/models/gpt2, /ckpt/model.safetensors, /ckpt/dcp",
    )
    upload = right.file_uploader("…or upload B (.safetensors / .pt / .bin)", key="cmp_upload",
                                 type=["safetensors", "pt", "pth", "bin"])
    if upload is not None:
        return session_uploads().save(upload.name, upload.getvalue())
    return server_source(text) if text.strip() else None  # the path gate: refused paths raise, named
