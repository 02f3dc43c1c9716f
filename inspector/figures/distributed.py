"""Figures of a distributed run: gradient norm per rank over steps, memory per rank."""

from __future__ import annotations

import html

import pandas as pd
import plotly.graph_objects as go

from ..escaping import escaped_figure, plot_text

MEMORY_COLUMNS = {  # column -> legend label
    "param_bytes": "parameters (local pieces)",
    "grad_bytes": "gradients (local pieces)",
    "buffer_bytes": "buffers",
    "device_allocated": "device allocated",
    "device_peak": "device peak",
    "rss": "process RSS",
}


@escaped_figure
def grad_norm_figure(per_rank: pd.DataFrame, steps: pd.DataFrame) -> go.Figure:
    """One line per rank (norm of its local gradient pieces) plus the global norm, over steps."""
    fig = go.Figure()
    for rank, rows in per_rank.groupby("rank", sort=True):
        fig.add_trace(go.Scatter(x=rows["step"], y=rows["grad_norm"], mode="lines+markers", name=f"rank {rank}",
                                 hovertemplate=f"rank {plot_text(rank)}<br>step %{{x}}<br>local norm %{{y:.4g}}<extra></extra>"))
    fig.add_trace(go.Scatter(x=steps["step"], y=steps["grad_norm"], mode="lines+markers", name="global",
                             line={"dash": "dash", "color": "#333"},
                             hovertemplate="global<br>step %{x}<br>norm %{y:.4g}<extra></extra>"))
    fig.update_layout(title="Gradient norm per rank", xaxis_title="step", yaxis_title="L2 norm",
                      height=360, margin={"l": 50, "r": 20, "t": 50, "b": 40})
    return fig


@escaped_figure
def memory_figure(per_rank: pd.DataFrame, step: int | None = None) -> go.Figure:
    """Grouped bars: each memory measure per rank at ``step`` (default: the last step)."""
    if step is None:
        step = int(per_rank["step"].max()) if len(per_rank) else 0
    rows = per_rank[per_rank["step"] == step].sort_values("rank")
    ranks = [f"rank {r}" for r in rows["rank"]]
    fig = go.Figure()
    for col, label in MEMORY_COLUMNS.items():
        values = pd.to_numeric(rows[col], errors="coerce")
        if values.isna().all():
            continue
        fig.add_trace(go.Bar(x=ranks, y=values / 2**20, name=html.escape(label),
                             hovertemplate=f"{html.escape(label)}<br>%{{x}}: %{{y:.3f}} MiB<extra></extra>"))
    fig.update_layout(title=f"Memory per rank at step {step}", yaxis_title="MiB", barmode="group",
                      height=360, margin={"l": 50, "r": 20, "t": 50, "b": 40})
    return fig
