"""Figures of a comparison: change per module in model order, two runs' losses and where they part."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..utils.escaping import escaped_figure, plot_text

CHANGED, UNCHANGED = "#4C78A8", "#E45756"
MAX_BARS = 80


def module_rows(modules: pd.DataFrame, max_bars: int = MAX_BARS) -> tuple[pd.DataFrame, str]:
    """The modules to draw and what they are: the innermost ones (those that hold tensors directly)
    when there are at most ``max_bars``, else every module of the deepest depth that has at most that many.

    >>> frame = pd.DataFrame({"module": ["a", "a.b", "a.c", "d"], "depth": [1, 2, 2, 1]})
    >>> rows, what = module_rows(frame)
    >>> rows["module"].tolist(), what
    (['a.b', 'a.c', 'd'], 'innermost modules')
    """
    names = modules["module"].tolist()
    inner = np.array([not any(other.startswith(m + ".") for other in names) for m in names], dtype=bool)
    if inner.sum() <= max_bars:  # a mask, also when empty (an empty list would select no column)
        return modules[inner], "innermost modules"
    counts = modules["depth"].value_counts()
    fitting = [int(d) for d, n in counts.items() if n <= max_bars]
    level = max(fitting) if fitting else int(counts.index.min())
    return modules[modules["depth"] == level], f"modules at depth {level}"


@escaped_figure
def module_change_bars(modules: pd.DataFrame, depth: int | None = None) -> go.Figure:
    """One bar per module (:func:`module_rows`, or every module at ``depth``), in model order: ‖B−A‖/‖A‖
    over its tensors. Modules whose tensors are all bitwise equal get a red marker at zero."""
    if depth is None:
        rows, what = module_rows(modules)
    else:
        rows, what = modules[modules["depth"] == depth], f"modules at depth {depth}"
    names = [plot_text(m) for m in rows["module"]]
    rel = [0.0 if math.isnan(v) else v for v in rows["rel_change"]]
    unchanged = (rows["changed"] == 0).tolist()
    data = list(zip(names, rel, rows["tensors"], rows["changed"], rows["max_abs"], unchanged, strict=True))
    moved = [d for d in data if not d[5]]
    # one trace per colour, so that each legend entry shows the colour of its own bars and marks
    fig = go.Figure(go.Bar(
        x=[d[0] for d in moved], y=[d[1] for d in moved], marker_color=CHANGED, name="changed",
        customdata=[d[2:5] for d in moved],
        hovertemplate="%{x}<br>‖B−A‖/‖A‖ %{y:.4g}<br>%{customdata[1]} of %{customdata[0]} tensors changed"
                      "<br>max |B−A| %{customdata[2]:.4g}<extra></extra>"))
    if any(unchanged):
        fig.add_trace(go.Scatter(x=[d[0] for d in data if d[5]], y=[0.0] * sum(unchanged), mode="markers",
                                 name="bitwise unchanged",
                                 marker={"symbol": "x", "size": 10, "color": UNCHANGED},
                                 hovertemplate="%{x}: every tensor bitwise equal<extra></extra>"))
    fig.update_layout(title=f"Change per module ({what}), in model order", yaxis_title="‖B−A‖ / ‖A‖",
                      height=380, margin={"l": 60, "r": 20, "t": 50, "b": 120}, showlegend=any(unchanged),
                      xaxis={"tickangle": -45, "type": "category", "categoryorder": "array",
                             "categoryarray": names})
    return fig


RUN_COLOURS = ("#1f77b4", "#ff7f0e")  # run A, run B: the same colour in both panels, as in the legend


MAX_BANDS = 20
Steps = Sequence[int] | np.ndarray


def nonfinite_bands(bad: Steps, steps: Steps) -> list[tuple[int, int]]:
    """The runs of consecutive recorded ``steps`` that are in ``bad``, as (first, last) step pairs; past
    ``MAX_BANDS`` the rest become one band from the next to the last.

    >>> nonfinite_bands([3, 4, 5, 9], [1, 2, 3, 4, 5, 6, 9])
    [(3, 5), (9, 9)]
    """
    steps = np.asarray(steps)
    idx = np.searchsorted(steps, np.unique(np.asarray(bad)))
    if not len(idx):
        return []
    cuts = np.flatnonzero(np.diff(idx) > 1)
    starts, ends = np.r_[idx[0], idx[cuts + 1]], np.r_[idx[cuts], idx[-1]]
    bands = [(int(steps[s]), int(steps[e])) for s, e in zip(starts, ends, strict=True)]
    if len(bands) > MAX_BANDS:
        bands = bands[:MAX_BANDS - 1] + [(bands[MAX_BANDS - 1][0], bands[-1][1])]
    return bands


@escaped_figure
def run_divergence_figure(steps: pd.DataFrame, first_divergence: int | None = None, a: str = "A",
                          b: str = "B", nonfinite: tuple[Steps | None, Steps | None] = (None, None),
                          ) -> go.Figure:
    """Loss and gradient norm of two runs over the steps, a line where they first part, and each run's
    steps whose loss or gradient norm was NaN/Inf (``nonfinite``: A's and B's) as a shaded band with a
    mark where it begins, so a line that stops says why."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("loss", "gradient norm"))
    for row, q in ((1, "loss"), (2, "grad_norm")):
        for side, label, dash, colour in (
            ("a", a, "solid", RUN_COLOURS[0]),
            ("b", b, "dash", RUN_COLOURS[1]),
        ):
            fig.add_trace(
                go.Scatter(
                    x=steps["step"],
                    y=steps[f"{q}_{side}"],
                    mode="lines",
                    name=plot_text(label),
                    line={"dash": dash, "color": colour},
                    legendgroup=side,
                    showlegend=row == 1,
                    hovertemplate=f"{plot_text(label)}<br>step %{{x}}<br>{q} %{{y:.5g}}<extra></extra>",
                ),
                row=row,
                col=1,
            )
    for which, label, bad, colour in zip("ab", (a, b), nonfinite, RUN_COLOURS, strict=False):
        for first, last in nonfinite_bands(bad if bad is not None else [], steps["step"].to_numpy()):
            fig.add_vrect(x0=first - 0.5, x1=last + 0.5, fillcolor=colour, opacity=0.15, line_width=0)
            for row, q in ((1, "loss"), (2, "grad_norm")):
                fig.add_trace(go.Scatter(
                    x=[first], y=[_last_finite(steps, f"{q}_{which}", first)], mode="markers",
                    marker={"symbol": "x", "size": 11, "color": colour}, name=f"{plot_text(label)}: NaN/Inf",
                    legendgroup=f"nan-{which}", showlegend=row == 1,
                    hovertemplate=f"{plot_text(label)} not finite, steps {first:,}–{last:,}<extra></extra>"),
                    row=row, col=1)
    if first_divergence is not None:
        fig.add_vline(x=first_divergence, line={"color": UNCHANGED, "dash": "dot"})
        fig.add_annotation(x=first_divergence, y=1, yref="paper",
                           text=f"diverge at step {first_divergence:,}", showarrow=False, yshift=10,
                           font={"color": UNCHANGED})
    fig.update_layout(height=460, margin={"l": 60, "r": 20, "t": 60, "b": 40}, title="Two runs side by side")
    fig.update_xaxes(title_text="step", row=2, col=1)
    return fig


def _last_finite(steps: pd.DataFrame, col: str, before: int) -> float:
    """The last finite value of ``col`` up to step ``before`` (where a line that stops stopped), else 0."""
    if col not in steps.columns:
        return 0.0
    up_to = pd.to_numeric(steps.loc[steps["step"] <= before, col], errors="coerce").to_numpy(dtype=float)
    finite = up_to[np.isfinite(up_to)]
    return float(finite[-1]) if len(finite) else 0.0
