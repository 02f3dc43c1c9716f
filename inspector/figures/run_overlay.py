"""Several runs on one pair of lines: the loss above the global gradient norm, one colour per run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ..utils.escaping import escaped_figure
from .training_steps import envelope, step_axis

COLOURS = ("#1F77B4", "#FF7F0E", "#2CA02C", "#D62728", "#9467BD", "#8C564B", "#E377C2", "#7F7F7F",
           "#BCBD22", "#17BECF")


@escaped_figure
def runs_overlay_figure(lines: dict[str, pd.DataFrame]) -> go.Figure:
    """The loss (where any run logged one) and the global gradient norm of every run in ``lines``
    (name -> ``step``, ``grad_norm`` and ``loss`` columns, one row per step), over steps.

    >>> f = runs_overlay_figure({"a": pd.DataFrame({"step": [0, 1], "grad_norm": [1.0, 2.0]}),
    ...                          "b": pd.DataFrame({"step": [0, 1], "grad_norm": [1.5, float("nan")]})})
    >>> [t.name for t in f.data], [float(v) for v in f.data[1].y]
    (['a', 'b'], [1.5])
    """
    def has(frame: pd.DataFrame, col: str) -> bool:
        return col in frame.columns and bool(pd.to_numeric(frame[col], errors="coerce").notna().any())

    panels = [(c, t) for c, t in (("loss", "loss"), ("grad_norm", "global gradient norm"))
              if any(has(f, c) for f in lines.values())] or [("grad_norm", "global gradient norm")]
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=[t for _, t in panels])
    first, last = 0.0, 1.0
    for i, (name, frame) in enumerate(lines.items()):
        colour = COLOURS[i % len(COLOURS)]
        if len(frame):
            first, last = min(first, float(frame["step"].min())), max(last, float(frame["step"].max()))
        for row, (col, label) in enumerate(panels, 1):
            if not has(frame, col):
                continue
            y_all = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
            x, y = envelope(frame["step"].to_numpy(), y_all)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, legendgroup=name, showlegend=row == 1,
                                     line={"color": colour},
                                     hovertemplate=f"{label}<br>step %{{x}}<br>%{{y:.4g}}"),  # + the run
                          row=row, col=1)
    fig.update_xaxes(**step_axis(first, last))
    fig.update_xaxes(title_text="step", row=len(panels), col=1)
    fig.update_layout(height=200 + 160 * len(panels), margin={"t": 40, "b": 40}, legend={"orientation": "h"})
    return fig


__all__ = ["runs_overlay_figure"]
