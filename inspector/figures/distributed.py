"""Figures of a distributed run: gradient norm per rank over steps, memory per rank.

A rank has one colour in every figure (rank ``r`` takes GPU ``r``'s colour, as the rank usually
drives that device); no other meaning shares those colours.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from ..structure.summary import format_bytes
from ..utils.escaping import escaped_figure, plot_text
from ..utils.units import bytes_ticks
from .palette import GPU_COLOURS
from .training_steps import MAX_LINE_POINTS, envelope

MEMORY_COLUMNS = {  # column -> axis label
    "param_bytes": "parameters (local pieces)",
    "grad_bytes": "gradients (local pieces)",
    "buffer_bytes": "buffers",
    "device_allocated": "device allocated",
    "device_peak": "device peak",
    "rss": "process RSS",
    "peak_rss": "process peak RSS",
}
RANK_SYMBOLS = [
    "circle-open",
    "square",
    "diamond-open",
    "cross",
    "triangle-up-open",
    "x",
    "star-open",
    "hexagon",
]
RANK_DASHES = ["solid", "dot", "dash", "dashdot", "longdash", "longdashdot"]


def rank_colour(rank: object) -> str:
    """The one colour of ``rank`` in every figure (a rank that is no integer: grey).

    >>> rank_colour(0), rank_colour(9) == rank_colour(1)
    ('#4C78A8', True)
    """
    try:
        return GPU_COLOURS[int(rank) % len(GPU_COLOURS)]  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return "#7F7F7F"


def _style(i: int) -> tuple[str, str]:
    return RANK_SYMBOLS[i % len(RANK_SYMBOLS)], RANK_DASHES[i % len(RANK_DASHES)]


@escaped_figure
def grad_norm_figure(per_rank: pd.DataFrame, steps: pd.DataFrame | None) -> go.Figure:
    """One line per rank (norm of its local gradient pieces) over the global norm, over steps.

    The global norm is a wide pale band underneath; each rank has its own colour, marker and dash,
    so ranks with equal norms (replicas) and a rank equal to the global norm all stay visible.
    ``steps`` (``step``, ``grad_norm``) may be None (no global norm). A long run is drawn from each
    bin's lowest and highest point (:func:`inspector.figures.training_steps.envelope`).
    """
    fig = go.Figure()
    if steps is not None and "grad_norm" in steps.columns and len(steps):
        fig.add_trace(go.Scatter(x=steps["step"], y=steps["grad_norm"], mode="lines", name="global",
                                 line={"color": "rgba(51,51,51,0.25)", "width": 10},
                                 hovertemplate="global<br>step %{x}<br>norm %{y:.4g}<extra></extra>"))
    for i, (rank, rows) in enumerate(per_rank.groupby("rank", sort=True)):
        symbol, dash = _style(i)
        x, y = (
            rows["step"].to_numpy(),
            pd.to_numeric(rows["grad_norm"], errors="coerce").to_numpy(dtype=float),
        )
        long = len(x) > MAX_LINE_POINTS
        if long:
            x, y = envelope(x, y)
        fig.add_trace(go.Scatter(
            x=x, y=y, mode="lines" if long else "lines+markers", name=f"rank {rank}",
            line={"color": rank_colour(rank), "dash": dash, "width": 2},
            marker={"symbol": symbol, "size": max(6, 12 - 2 * i), "color": rank_colour(rank),
                    "line": {"width": 2, "color": rank_colour(rank)}},
            hovertemplate=f"rank {plot_text(rank)}<br>step %{{x}}<br>local norm %{{y:.4g}}<extra></extra>"))
    fig.update_layout(title="Gradient norm per rank", xaxis_title="step", yaxis_title="L2 norm",
                      height=360, margin={"l": 50, "r": 20, "t": 50, "b": 40},
                      legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"})
    fig.update_xaxes(tickformat="d", automargin=True)
    return fig


@escaped_figure
def memory_figure(per_rank: pd.DataFrame, step: int | None = None) -> go.Figure:
    """Grouped bars at ``step`` (default: the last step): each memory measure, one bar per rank in
    the rank's colour, on a log axis in binary units (a few KiB of buffers beside GiB of RSS)."""
    if step is None:
        step = int(per_rank["step"].max()) if len(per_rank) else 0
    rows = per_rank[per_rank["step"] == step].sort_values("rank")
    measures = [c for c in MEMORY_COLUMNS if c in rows.columns
                and (pd.to_numeric(rows[c], errors="coerce") > 0).any()]
    fig = go.Figure()
    shown = []
    for row in rows.to_dict("records"):
        values = [pd.to_numeric(row[c], errors="coerce") for c in measures]
        values = [float(v) if v is not None and v == v and v > 0 else None for v in values]
        shown += [v for v in values if v]
        label = f"rank {row['rank']}"
        fig.add_trace(go.Bar(x=[MEMORY_COLUMNS[c] for c in measures], y=values, name=label,
                             marker_color=rank_colour(row["rank"]),
                             text=[format_bytes(v) if v else "" for v in values], textposition="outside",
                             hovertemplate=f"{plot_text(label)}<br>%{{x}}: %{{text}}<extra></extra>"))
    tickvals, ticktext = bytes_ticks(max(shown, default=1024.0), bottom=min(shown, default=1.0))
    fig.update_layout(
        title=f"Memory per rank at step {step}",
        yaxis_title="bytes (log scale)",
        barmode="group",
        height=380,
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
        uniformtext_minsize=9,
        legend={"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 1, "xanchor": "right"},
    )
    top = math.log10(max(shown, default=1024.0) * 8)
    fig.update_yaxes(
        type="log",
        tickvals=tickvals,
        ticktext=ticktext,
        range=[math.log10(min(shown, default=1.0) / 4), top],
        automargin=True,
    )
    return fig
