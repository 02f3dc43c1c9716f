"""Figures of a training run along its steps: the loss and global gradient norm as lines, and the
findings on a timeline, on a shared whole-step axis.

Every figure stays small whatever the run's length: the lines keep each bin's lowest and highest
point, the timeline at most ``MAX_MARKS`` points.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..utils.escaping import escaped_figure

MAX_LINE_POINTS = 2_000
MAX_MARKS = 2_000
SEVERITY_COLOURS = {"error": "#D62728", "warning": "#FF7F0E", "info": "#1F77B4"}


def step_axis(first: float, last: float) -> dict:
    """A step axis: whole steps only (a run of a few steps gets one tick per step, never 0.5),
    with thousands separators.

    >>> step_axis(0, 3)["dtick"], step_axis(0, 10_000).get("dtick")
    (1, None)
    """
    axis: dict = {"tickformat": ",d", "automargin": True}
    if last - first <= 10:
        axis["dtick"] = 1
    return axis


def envelope(
    x: np.ndarray, y: np.ndarray, max_points: int = MAX_LINE_POINTS
) -> tuple[np.ndarray, np.ndarray]:
    """At most ``max_points`` points of a line: each of ``max_points // 2`` bins keeps its lowest
    and its highest point, in step order (a spike survives); NaN points are kept out.

    >>> envelope(np.arange(6), np.array([1., 5, 2, 3, 0, 4]), max_points=4)
    (array([0, 1, 4, 5]), array([1., 5., 0., 4.]))
    """
    x, y = np.asarray(x), np.asarray(y, dtype=np.float64)
    finite = np.isfinite(y)
    x, y = x[finite], y[finite]
    if len(y) <= max_points:
        return x, y
    bins = max(1, max_points // 2)
    size = math.ceil(len(y) / bins)
    keep = []
    for start in range(0, len(y), size):
        part = y[start:start + size]
        keep += sorted({start + int(np.argmin(part)), start + int(np.argmax(part))})
    idx = np.asarray(keep)
    return x[idx], y[idx]


NAN_MARK = "NaN or Inf (drawn at the bottom of its panel)"


@escaped_figure
def loss_norm_figure(steps: pd.DataFrame) -> go.Figure:
    """The loss (when recorded) above the global gradient norm, over steps, sharing the step axis.

    ``steps``: ``step`` and ``grad_norm`` columns, ``loss`` where logged. Long runs are drawn from
    each bin's lowest and highest point (:func:`envelope`); a step whose value was NaN or Inf is a
    red × at the bottom of its panel.
    """
    panels = [(c, t) for c, t in (("loss", "loss"), ("grad_norm", "global gradient norm"))
              if c in steps.columns and pd.to_numeric(steps[c], errors="coerce").notna().any()]
    panels = panels or [("grad_norm", "global gradient norm")]
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[t for _, t in panels])
    x_all = steps["step"].to_numpy()
    for row, (col, label) in enumerate(panels, 1):
        y_all = (pd.to_numeric(steps[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
                 if col in steps.columns else np.full(len(steps), np.nan))
        x, y = envelope(x_all, y_all)
        fig.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                name=label,
                line={"color": "#333333"},
                showlegend=False,
                hovertemplate=f"{label}<br>step %{{x}}<br>%{{y:.4g}}<extra></extra>",
            ),
            row=row,
            col=1,
        )
        bad = _not_finite_steps(steps, col)
        if bad.size:
            floor = float(y.min()) if y.size else 0.0
            fig.add_trace(go.Scatter(x=bad, y=np.full(bad.size, floor), mode="markers", name=NAN_MARK,
                                     marker={"symbol": "x", "color": "#D62728", "size": 8}, legendgroup="bad",
                                     showlegend=not any(t.name == NAN_MARK for t in fig.data),
                                     hovertemplate=f"{label} not finite<br>step %{{x}}<extra></extra>"),
                          row=row, col=1)
        if col == "grad_norm" and y.size and (y > 0).all():  # label decades only: 1, 10, 100, not 2 5 2 5
            fig.update_yaxes(type="log", row=row, col=1, **({"dtick": 1} if y.max() >= 10 * y.min() else {}))
    if len(x_all):
        fig.update_xaxes(**step_axis(float(np.min(x_all)), float(np.max(x_all))))
    fig.update_xaxes(title_text="step", row=len(panels), col=1)
    fig.update_layout(height=200 + 160 * len(panels), showlegend=any(t.name == NAN_MARK for t in fig.data),
                      margin={"l": 60, "r": 20, "t": 40, "b": 40},
                      legend={"orientation": "h", "yanchor": "bottom", "y": 1.04, "xanchor": "right", "x": 1})
    return fig


def _not_finite_steps(steps: pd.DataFrame, col: str) -> np.ndarray:
    """Steps where ``col`` was recorded as NaN or Inf: an Inf, a NaN loss that was logged
    (``loss_logged``), or a NaN on a step whose ``nonfinite`` count is above zero (elsewhere a
    NaN is a step that recorded no value)."""
    if col not in steps.columns:
        return steps["step"].to_numpy()[:0]
    y = pd.to_numeric(steps[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = np.isinf(y)
    if "nonfinite" in steps.columns:
        bad |= np.isnan(y) & (pd.to_numeric(steps["nonfinite"], errors="coerce").fillna(0).to_numpy() > 0)
    if col == "loss" and "loss_logged" in steps.columns:
        bad |= np.isnan(y) & steps["loss_logged"].fillna(False).to_numpy(dtype=bool)
    return steps["step"].to_numpy()[bad][:MAX_MARKS]


@escaped_figure
def findings_timeline(findings: pd.DataFrame, steps: tuple[int, int] | None = None) -> go.Figure:
    """Each finding a point at its step, one row per code, coloured by severity.

    ``findings``: ``step``, ``code``, ``severity``, ``where``, ``message`` columns (``rank`` too
    where known); ``steps``: the run's first and last step, so the axis spans the whole run.
    Click a point to go to its step.
    """
    fig = go.Figure()
    shown = findings.sort_values("step", kind="stable").head(MAX_MARKS)
    for severity, colour in SEVERITY_COLOURS.items():
        rows = shown[shown["severity"] == severity]
        if not len(rows):
            continue
        ranks = rows["rank"] if "rank" in rows.columns else pd.Series([None] * len(rows), index=rows.index)
        where = [f"{w} on rank {int(r)}" if r is not None and r == r else str(w)
                 for w, r in zip(rows["where"], ranks, strict=True)]
        fig.add_trace(
            go.Scatter(
                x=rows["step"],
                y=rows["code"],
                mode="markers",
                name=severity,
                marker={"color": colour, "size": 10, "symbol": "diamond"},
                customdata=[[w, str(m)[:200]] for w, m in zip(where, rows["message"], strict=True)],
                hovertemplate="%{y} at step %{x}<br>%{customdata[0]}<br>%{customdata[1]}<extra></extra>",
            )
        )
    codes = shown["code"].nunique() if len(shown) else 1
    fig.update_layout(title="Findings by step" + (f" (the first {MAX_MARKS:,} of {len(findings):,})"
                                                   if len(findings) > MAX_MARKS else ""),
                      xaxis_title="step", yaxis={"type": "category", "automargin": True},
                      xaxis=_timeline_axis(findings, steps),
                      height=int(160 + 28 * codes), clickmode="event+select",
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"},
                      margin={"l": 60, "r": 20, "t": 60, "b": 40})
    return fig


def _timeline_axis(findings: pd.DataFrame, steps: tuple[int, int] | None) -> dict:
    lo, hi = steps if steps is not None else (
        (int(findings["step"].min()), int(findings["step"].max())) if len(findings) else (0, 1))
    pad = max(0.5, (hi - lo) * 0.02)
    return {**step_axis(lo, hi), "range": [lo - pad, hi + pad]}
