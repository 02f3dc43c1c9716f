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
from ..utils.escaping import escaped_figure
from .palette import legend_on_top, readable, whole_ticks

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
    fig.add_bar(
        x=(data["left"] + data["right"]) / 2,
        y=data["count"],
        name="copy (what the module output)",
        marker=dict(color=OK_COLOR, line=dict(width=0)),
        width=(data["right"] - data["left"]).tolist(),
    )
    if reference is not None and len(data):
        r = _finite_float(first_tensor(reference)).float()
        lo, hi = float(data["left"].iloc[0]), float(data["right"].iloc[-1])
        counts = torch.histc(r.clamp(lo, hi), bins=bins, min=lo, max=hi).long().tolist()
        edges = [*data["left"].tolist(), float(data["right"].iloc[-1])]
        fig.add_scatter(
            x=edges,
            y=[*counts, counts[-1]],
            mode="lines",
            line=dict(shape="hv", color=MUTATED_COLOR, width=2.5),
            name="bare reference (what a naive hook holds)",
        )
    fig.update_layout(barmode="overlay", title=(title or f"values {tuple(t.shape)}") + _not_drawn(t),
                      xaxis_title="value", yaxis_title="count", bargap=0)
    return readable(legend_on_top(fig))


def _not_drawn(t: torch.Tensor) -> str:
    """`` (2 NaN, 1 Inf of 256 values not drawn)`` when ``t`` holds values a histogram cannot bin."""
    if not (t.is_floating_point() or t.is_complex()):
        return ""
    x = t.detach()
    nan, inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
    parts = [f"{n:,} {what}" for n, what in ((nan, "NaN"), (inf, "Inf")) if n]
    return f" ({', '.join(parts)} of {x.numel():,} values not drawn)" if parts else ""


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
    bad = ~torch.isfinite(m)
    fig = go.Figure(go.Heatmap(z=torch.where(bad, torch.nan, m).tolist(), colorscale="RdBu", zmid=0,
                               colorbar=dict(title="value")))
    rows_, cols_ = torch.nonzero(bad, as_tuple=True)
    if rows_.numel():  # a NaN/Inf cell is no colour: a red x says what it holds
        fig.add_scatter(x=cols_.tolist(), y=rows_.tolist(), mode="markers", name="NaN or Inf",
                        marker=dict(symbol="x", color=MUTATED_COLOR, size=8),
                        hovertemplate="row %{y}, column %{x}: NaN or Inf<extra></extra>")
    pooled = "" if tuple(m.shape) == _raw_shape(t) else f", pooled to {tuple(m.shape)}"
    fig.update_layout(title=title or f"{tuple(t.shape)}{pooled}", xaxis_title=cols, yaxis_title=rows,
                      yaxis_autorange="reversed")
    if rows_.numel():  # one legend entry: plotly hides a lone one unless told
        legend_on_top(fig).update_layout(showlegend=True)
    whole_ticks(fig, m.shape[1] - 1, "x")
    return whole_ticks(fig, m.shape[0] - 1, "y")


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
    Modules run down the y axis, so every name reads in full; when every difference is 0 the
    figure says so instead of drawing an empty box.

    >>> t = pd.DataFrame({"module": ["a", "b"], "max_abs_diff": [0.0, 0.0], "corrupted": [False, False],
    ...                   "overwritten_by": [None, None]})
    >>> clone_vs_reference_figure(t).layout.annotations[0].text[:29]
    'Every difference is 0: each b'
    """
    colors = [MUTATED_COLOR if c else OK_COLOR for c in table["corrupted"]]
    labels = [f"overwritten by {b}" if c and b else ("overwritten" if c else "")
              for c, b in zip(table["corrupted"], table["overwritten_by"], strict=True)]
    diffs = table["max_abs_diff"].fillna(0.0)
    fig = go.Figure(go.Bar(y=table["module"], x=diffs, orientation="h", marker_color=colors,
                           text=labels, textposition="outside",
                           hovertemplate="%{y}<br>max |copy - bare| = %{x:.4g}<extra></extra>"))
    fig.update_layout(title=title, yaxis_title="module", xaxis_title="max |copy - bare reference|",
                      showlegend=False, yaxis=dict(autorange="reversed", type="category"),
                      height=min(140 + 20 * len(table), 1600))
    if len(table) and not (diffs != 0).any():
        fig.update_xaxes(range=[0, 1], tickvals=[0], ticktext=["0"])
        fig.add_annotation(text="Every difference is 0: each bare reference still equals its copy "
                                "(nothing overwrote these outputs)", showarrow=False, x=0.5, y=0.5,
                           xref="paper", yref="paper", bgcolor="white")
    return readable(fig)


@escaped_figure
def capture_stats_figure(stats: pd.DataFrame, title: str = "Activation statistics") -> go.Figure:
    """Mean with one standard deviation, and min/max, of each captured output, in call order.

    Modules run down the y axis (every name reads in full). The value axis spans the means and
    standard deviations; a min or max beyond it is drawn at its edge as an open marker, so one
    huge output (logits, a mask) no longer flattens the others. Mutated outputs are red.
    """
    rows = stats[stats["kind"] == "output"] if "kind" in stats else stats
    paths = rows["path"] if "path" in rows else pd.Series([""] * len(rows), index=rows.index)
    labels = [m if not p else f"{m}{p}" for m, p in zip(rows["module"], paths, strict=True)]
    mutated = (
        rows["mutated"].fillna(False).astype(bool).tolist() if "mutated" in rows else [False] * len(rows)
    )
    std = rows["std"].fillna(0.0)
    lo, hi = float((rows["mean"] - std).min()), float((rows["mean"] + std).max())
    pad = (hi - lo) * 0.5 or 1.0
    lo, hi = lo - pad, hi + pad
    fig = go.Figure()
    for col, name, symbol in (("max", "max", "triangle-right"), ("min", "min", "triangle-left")):
        vals = rows[col].astype(float)
        out = (vals > hi) | (vals < lo)
        fig.add_scatter(
            y=labels,
            x=vals.clip(lo, hi),
            mode="markers",
            name=name,
            customdata=vals,
            hovertemplate="%{y}<br>" + name + " %{customdata:.4g}<extra></extra>",
            marker=dict(symbol=[f"{symbol}-open" if o else symbol for o in out], color="#999"),
        )
    fig.add_scatter(y=labels, x=rows["mean"], mode="markers", name="mean ± std",
                    error_x=dict(type="data", array=std.tolist(), color="#555555"),
                    marker=dict(color=[MUTATED_COLOR if m else OK_COLOR for m in mutated], size=8))
    fig.update_layout(title=title, yaxis_title="module", xaxis_title="value (open marker: beyond the axis)",
                      xaxis_range=[lo, hi], yaxis=dict(autorange="reversed", type="category"),
                      height=min(180 + 20 * len(labels), 1600))
    return readable(legend_on_top(fig))
