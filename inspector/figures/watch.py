"""Figures of a watched run: loss and gradient norm over steps, a module × step heatmap."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..escaping import escaped_figure, plot_text
from ..watch import Heatmap, Run


@escaped_figure
def run_lines_figure(run: Run) -> go.Figure:
    """Loss (top) and global gradient norm (bottom, log scale) over steps, one line per rank;
    finding steps marked on both."""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("loss", "gradient norm"))
    for rank, rows in run.steps.groupby("rank", sort=True):
        name = f"rank {rank}" if run.world_size > 1 else ""
        for row, col in ((1, "loss"), (2, "grad_norm")):
            fig.add_trace(go.Scattergl(x=rows["step"], y=rows[col], mode="lines", name=name or col,
                                       legendgroup=str(rank), showlegend=row == 1 and bool(name),
                                       hovertemplate=f"{plot_text(name)} step %{{x}}<br>{col} %{{y:.4g}}<extra></extra>"),
                          row=row, col=1)
    for f in run.findings[:200]:
        fig.add_vline(x=f.step, line={"color": "#d62728" if f.severity == "error" else "#ff7f0e", "width": 1,
                                      "dash": "dot"})
    fig.update_yaxes(type="log", row=2, col=1)
    fig.update_layout(height=460, showlegend=run.world_size > 1, margin={"l": 50, "r": 20, "t": 40, "b": 40},
                      xaxis2_title="step")
    return fig


@escaped_figure
def heatmap_figure(h: Heatmap) -> go.Figure:
    """The module × step grid on a log colour scale (log10 of the value; zero and NaN blank)."""
    with np.errstate(all="ignore"):
        z = np.where(h.values > 0, np.log10(h.values), np.nan)
    label = h.column.replace("_", " ")
    fig = go.Figure(go.Heatmap(
        z=z, x=h.steps, y=list(h.modules), colorscale="Viridis", colorbar={"title": f"log10 {label}"},
        hovertemplate=f"%{{y}}<br>step %{{x}}<br>log10 {label} %{{z:.3f}}<extra></extra>"))
    pooled = [f"{h.steps_per_column} steps" if h.steps_per_column > 1 else "",
              f"{h.modules_per_row} modules" if h.modules_per_row > 1 else ""]
    note = " and ".join(p for p in pooled if p)
    fig.update_layout(title=f"{label} per module and step" + (f" (max over {note} per cell)" if note else ""),
                      xaxis_title="step", yaxis={"autorange": "reversed"},
                      height=min(1200, 200 + 12 * len(h.modules)), margin={"l": 50, "r": 20, "t": 50, "b": 40})
    return fig
