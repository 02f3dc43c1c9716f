"""Figures for activation captures: histogram, 2-D slice heatmap, clone vs bare reference.

Data in (a captured value, a tensor, the stats frame or the drift frame of
:func:`inspector.capture.reference_drift`), go.Figure out; the figures compute no
differences themselves. Big tensors are aggregated first (histograms are binned, heatmaps are pooled to at
most a few hundred cells a side), so no figure carries tens of thousands of marks.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch

from ..capture import first_tensor
from ..escaping import escaped_figure
from .palette import readable

MAX_ROWS = 128
MAX_COLS = 192
MUTATED_COLOR = "#d62728"
OK_COLOR = "#1f77b4"


def _finite_float(t: torch.Tensor) -> torch.Tensor:
    x = t.detach().to("cpu")
    x = x.abs() if x.is_complex() else x
    x = x.double() if x.dtype == torch.float64 else x.float()
    return x[torch.isfinite(x)].flatten()


def histogram_data(t: torch.Tensor, bins: int = 60) -> pd.DataFrame:
    """Binned values of ``t`` (finite values only): columns left, right, count.

    >>> histogram_data(torch.tensor([0.0, 0.0, 1.0]), bins=2)["count"].tolist()
    [2, 1]
    """
    x = _finite_float(t)
    if x.numel() == 0:
        return pd.DataFrame(columns=["left", "right", "count"])
    lo, hi = float(x.min()), float(x.max())
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    counts = torch.histc(x.float(), bins=bins, min=lo, max=hi)
    edges = torch.linspace(lo, hi, bins + 1)
    return pd.DataFrame({"left": edges[:-1].tolist(), "right": edges[1:].tolist(),
                         "count": counts.long().tolist()})


@escaped_figure
def capture_histogram(value: Any, title: str = "", bins: int = 60,
                      reference: Any = None) -> go.Figure:
    """Histogram of one capture (the first tensor of a structured output).

    With ``reference`` (the bare live output a naive hook kept), both are drawn on the
    same bins, so the values the overwrite destroyed show up.
    """
    t = first_tensor(value)
    fig = go.Figure()
    data = histogram_data(t, bins)
    # Solid bars for the copy and an outline for the reference: where they overlap neither colour
    # is blended, so the legend's swatches are the colours drawn.
    fig.add_bar(x=(data["left"] + data["right"]) / 2, y=data["count"], name="copy (what the module output)",
                marker=dict(color=OK_COLOR, line=dict(width=0)), width=(data["right"] - data["left"]).tolist())
    if reference is not None and len(data):
        r = _finite_float(first_tensor(reference)).float()
        lo, hi = float(data["left"].iloc[0]), float(data["right"].iloc[-1])
        counts = torch.histc(r.clamp(lo, hi), bins=bins, min=lo, max=hi).long().tolist()
        edges = [*data["left"].tolist(), float(data["right"].iloc[-1])]
        fig.add_scatter(x=edges, y=[*counts, counts[-1]], mode="lines", line=dict(shape="hv", color=MUTATED_COLOR,
                        width=2.5), name="bare reference (what a naive hook holds)")
    fig.update_layout(barmode="overlay", title=title or f"values {tuple(t.shape)}",
                      xaxis_title="value", yaxis_title="count", bargap=0, legend=dict(orientation="h"))
    return readable(fig)


def heatmap_slice(t: torch.Tensor) -> tuple[torch.Tensor, str, str]:
    """A 2-D view of a capture: (matrix, row label, column label).

    Sequences ``(B, T, C)`` give tokens x channels of the first sample; convolution maps
    ``(B, C, H, W)`` give samples x per-channel means (over H and W); 2-D tensors are
    shown as they are; anything else is flattened to rows of its last dimension. Large
    slices are average-pooled to at most MAX_ROWS x MAX_COLS cells.

    >>> m, rows, cols = heatmap_slice(torch.ones(2, 8, 4, 4))
    >>> tuple(m.shape), rows, cols
    ((2, 8), 'sample', 'channel (mean over H, W)')
    """
    x = t.detach().to("cpu")
    x = (x.abs() if x.is_complex() else x).double() if x.dtype == torch.float64 else \
        (x.abs() if x.is_complex() else x).float()
    if x.dim() == 4:
        m, rows, cols = x.mean(dim=(2, 3)), "sample", "channel (mean over H, W)"
    elif x.dim() == 3:
        m, rows, cols = x[0], "token (sample 0)", "channel"
    elif x.dim() == 2:
        m, rows, cols = x, "row", "column"
    elif x.dim() <= 1:
        m, rows, cols = x.reshape(1, -1), "", "element"
    else:
        m, rows, cols = x.reshape(-1, x.shape[-1]), "flattened leading dims", "last dim"
    return _pool(m, MAX_ROWS, MAX_COLS), rows, cols


def _pool(m: torch.Tensor, max_rows: int, max_cols: int) -> torch.Tensor:
    r, c = m.shape
    if r > max_rows or c > max_cols:
        size = (min(r, max_rows), min(c, max_cols))
        m = torch.nn.functional.adaptive_avg_pool2d(m[None, None], size)[0, 0]
    return m


@escaped_figure
def capture_heatmap(value: Any, title: str = "") -> go.Figure:
    """Heatmap of a 2-D slice of one capture (see :func:`heatmap_slice`)."""
    t = first_tensor(value)
    m, rows, cols = heatmap_slice(t)
    fig = go.Figure(go.Heatmap(z=m.tolist(), colorscale="RdBu", zmid=0, colorbar=dict(title="value")))
    pooled = "" if tuple(m.shape) == _raw_shape(t) else f", pooled to {tuple(m.shape)}"
    fig.update_layout(title=title or f"{tuple(t.shape)}{pooled}", xaxis_title=cols, yaxis_title=rows,
                      yaxis_autorange="reversed")
    return fig


def _raw_shape(t: torch.Tensor) -> tuple[int, ...]:
    if t.dim() == 4:
        return (t.shape[0], t.shape[1])
    if t.dim() == 3:
        return tuple(t.shape[1:])
    return tuple(t.shape) if t.dim() == 2 else ()


@escaped_figure
def clone_vs_reference_figure(table: pd.DataFrame, title: str = "Copy vs bare reference") -> go.Figure:
    """One bar per captured module: how far a bare reference drifted from the true output.

    ``table`` is :func:`inspector.capture.reference_drift` of a capture (columns module,
    max_abs_diff, corrupted, overwritten_by). Corrupted captures (the live output was
    overwritten after the hook) are red and labelled with the module that overwrote them.
    """
    colors = [MUTATED_COLOR if c else OK_COLOR for c in table["corrupted"]]
    labels = [f"overwritten by {b}" if c and b else ("overwritten" if c else "")
              for c, b in zip(table["corrupted"], table["overwritten_by"])]
    fig = go.Figure(go.Bar(x=table["module"], y=table["max_abs_diff"].fillna(0.0), marker_color=colors,
                           text=labels, textposition="outside",
                           hovertemplate="%{x}<br>max |copy - bare| = %{y:.4g}<extra></extra>"))
    fig.update_layout(title=title, xaxis_title="module", yaxis_title="max |copy - bare reference|",
                      showlegend=False)
    return readable(fig)


@escaped_figure
def capture_stats_figure(stats: pd.DataFrame, title: str = "Activation statistics") -> go.Figure:
    """Mean with one standard deviation, and min/max, of each captured output, in call order.

    Mutated outputs (changed in place after their capture) are red.
    """
    rows = stats[stats["kind"] == "output"] if "kind" in stats else stats
    labels = [m if not p else f"{m}{p}" for m, p in zip(rows["module"], rows.get("path", [""] * len(rows)))]
    mutated = rows["mutated"].fillna(False).astype(bool).tolist() if "mutated" in rows else [False] * len(rows)
    fig = go.Figure()
    fig.add_scatter(x=labels, y=rows["max"], mode="markers", name="max", marker=dict(symbol="triangle-up",
                    color="#999"))
    fig.add_scatter(x=labels, y=rows["min"], mode="markers", name="min", marker=dict(symbol="triangle-down",
                    color="#999"))
    fig.add_scatter(x=labels, y=rows["mean"], mode="markers", name="mean ± std",
                    error_y=dict(type="data", array=rows["std"].fillna(0.0).tolist(), color="#555555"),
                    marker=dict(color=[MUTATED_COLOR if m else OK_COLOR for m in mutated], size=8))
    fig.update_layout(title=title, xaxis_title="module", yaxis_title="value", legend=dict(orientation="h"))
    return readable(fig)
