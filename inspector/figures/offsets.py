"""The flat-vector strip (one segment per tensor, coloured by gradient norm) and per-layer norm bars."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from ..utils.escaping import escaped_figure, plot_text
from .palette import count_axis, legend_on_top, log_decades, readable

FULL_ROW = "parameters()"
TRAINABLE_ROW = "trainable only"
STYLE = {  # state -> (legend label, colour, bar pattern)
    "nonfinite": ("NaN / Inf gradient", "#d62728", ""),
    "none": ("trainable, no gradient", "#c7c7c7", "/"),
    "frozen": ("frozen (requires_grad=False)", "#555555", "x"),
    "trainable": ("trainable", "#1f77b4", ""),
    "buffer": ("buffer (not a parameter)", "#bcbd22", "."),
}


@dataclass(frozen=True)
class Segment:
    """One mark of the strip: a tensor, or a run of neighbouring tensors on big models."""

    row: str
    start: int
    end: int
    state: str       # "ok" | "none" | "frozen" | "nonfinite" | "trainable" | "buffer"
    norm: float      # L2 norm of the gradients in it (NaN: none)
    tensors: int
    hover: str       # escaped HTML


def _state(row, norms: dict[str, tuple[float, str]] | None) -> tuple[str, float]:
    if row.kind == "buffer":
        return "buffer", math.nan
    if norms is None:
        return ("trainable" if row.requires_grad else "frozen"), math.nan
    norm, state = norms.get(row.name, (math.nan, "none" if row.requires_grad else "frozen"))
    return state, norm


def strip_segments(table: pd.DataFrame, norms: pd.DataFrame | None = None, row: str = FULL_ROW,
                   max_segments: int = 300) -> list[Segment]:
    """Segments for one row of the strip; at most ``max_segments`` (neighbours merged).

    A merged segment's state is the worst inside it (nonfinite, then ok, none, frozen) and its
    norm the root of the sum of squares of its parts.

    >>> from torch import nn
    >>> from inspector.offsets import offset_map
    >>> segs = strip_segments(offset_map(nn.Linear(2, 3)))
    >>> [(s.start, s.end, s.state) for s in segs]
    [(0, 6, 'trainable'), (6, 9, 'trainable')]
    """
    lookup = None
    if norms is not None:
        lookup = dict(
            zip(norms["name"], zip(norms["norm"].astype(float), norms["state"], strict=True), strict=True)
        )
    rows = list(table.itertuples(index=False))
    if not rows:
        return []
    chunk = max(1, math.ceil(len(rows) / max_segments))
    parts: list[list] = []
    for r in rows:  # runs of up to `chunk` neighbours; parameters and buffers never share a mark
        if not parts or len(parts[-1]) == chunk or parts[-1][-1].kind != r.kind:
            parts.append([])
        parts[-1].append(r)
    out = []
    for part in parts:
        states, sq, have = [], 0.0, False
        for r in part:
            st, norm = _state(r, lookup)
            states.append(st)
            if not math.isnan(norm):
                sq += norm * norm
                have = True
        state = next(s for s in ("nonfinite", "buffer", "ok", "trainable", "none", "frozen") if s in states)
        norm = math.sqrt(sq) if have else math.nan
        first, last = part[0], part[-1]
        if len(part) == 1:
            head = (f"<b>{plot_text(first.name)}</b><br>shape {plot_text(str(tuple(first.shape)))} "
                    f"{plot_text(first.dtype)}")
            if first.aliases:
                head += f"<br>also {plot_text(', '.join(first.aliases))}"
        else:
            counts = {s: states.count(s) for s in dict.fromkeys(states)}
            head = (f"<b>{len(part)} tensors</b>: {plot_text(first.name)} … {plot_text(last.name)}"
                    f"<br>{plot_text(', '.join(f'{n} {s}' for s, n in counts.items()))}")
        grad = "" if lookup is None or state == "buffer" else (
            f"<br>gradient norm {norm:.4g}" if have else "<br>no gradient")
        hover = (f"{head}<br>range [{first.start:,}, {last.end:,}) — {last.end - first.start:,} elements"
                 f"<br>state {state}{grad}")
        out.append(Segment(row, int(first.start), int(last.end), state, norm, len(part), hover))
    return out


@escaped_figure
def offset_strip(full: pd.DataFrame, trainable: pd.DataFrame | None = None,
                 norms: pd.DataFrame | None = None, max_segments: int = 300) -> go.Figure:
    """x = flat offset; one segment per tensor, coloured by log10 of its gradient norm.

    Args:
        full: :func:`~inspector.offsets.offset_map` of every parameter (and buffers, if wanted).
        trainable: the ``trainable_only=True`` map, drawn as a second row: every segment after
            a frozen one moves left by the frozen elements in front of it.
        norms: :func:`~inspector.offsets.gradient_norms` by parameter; without it segments are
            coloured trainable / frozen.
        max_segments: marks per row; neighbouring tensors are merged beyond it.

    >>> from torch import nn
    >>> from inspector.offsets import offset_map
    >>> m = nn.Linear(2, 3)
    >>> len(offset_strip(offset_map(m), offset_map(m, trainable_only=True)).data) > 0
    True
    """
    segments = strip_segments(full, norms, FULL_ROW, max_segments)
    if trainable is not None:
        segments += strip_segments(trainable, norms, TRAINABLE_ROW, max_segments)
    fig = go.Figure()
    ok = [s for s in segments if s.state == "ok"]
    if ok:
        logs = [math.log10(max(s.norm, 1e-30)) for s in ok]
        lo, hi = min(logs), max(logs)
        span = hi - lo or 1.0
        # Colours are computed here: plotly.js warns "Invalid color specifier" for bars coloured by
        # numbers. An invisible marker carries the colour bar.
        colours = sample_colorscale("Viridis", [(v - lo) / span for v in logs])
        fig.add_trace(go.Bar(
            y=[s.row for s in ok], x=[s.end - s.start for s in ok], base=[s.start for s in ok],
            orientation="h", name="gradient norm", hovertext=[s.hover for s in ok], showlegend=False,
            hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(color=colours, line=dict(width=0.5, color="white"))))
        fig.add_trace(
            go.Scatter(
                x=[ok[0].start, ok[0].start],
                y=[ok[0].row, ok[0].row],
                mode="markers",
                opacity=0,
                showlegend=False,
                hoverinfo="skip",
                name="log10 gradient norm",
                marker=dict(
                    color=[lo, hi],
                    colorscale="Viridis",
                    showscale=True,
                    colorbar=dict(title="log10 ‖grad‖", thickness=12),
                ),
            )
        )
    for state, (label, colour, pattern) in STYLE.items():
        segs = [s for s in segments if s.state == state]
        if not segs:
            continue
        fig.add_trace(go.Bar(
            y=[s.row for s in segs], x=[s.end - s.start for s in segs], base=[s.start for s in segs],
            orientation="h", name=label, hovertext=[s.hover for s in segs],
            hovertemplate="%{hovertext}<extra></extra>",
            marker=dict(color=colour, pattern=dict(shape=pattern), line=dict(width=0.5, color="white"))))
    rows = [FULL_ROW] + ([TRAINABLE_ROW] if trainable is not None else [])
    fig.update_layout(
        barmode="overlay", showlegend=True, height=190 + 60 * len(rows), margin=dict(l=10, r=10, t=40, b=40),
        title="Flat vector: one segment per tensor",
        xaxis=dict(title="flat offset (elements)", rangemode="tozero"),
        yaxis=dict(categoryorder="array", categoryarray=rows[::-1]))
    count_axis(fig, max((s.end for s in segments), default=0))
    legend_on_top(fig)
    return fig


@escaped_figure
def layer_norm_bars(by_module: pd.DataFrame, top_k: int = 15) -> go.Figure:
    """Gradient norm of each layer (a module's own parameters, not its children's): the
    largest ``top_k``, plus one bar for the rest (root of the sum of their squares), on a log axis.

    Parameters held by the model itself (not by a submodule) show as ``(model)``.

    >>> from inspector.offsets import gradient_norms
    >>> from torch import nn
    >>> import torch
    >>> m = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False))
    >>> m[0].weight.grad = torch.tensor([[3.0]]); m[1].weight.grad = torch.tensor([[4.0]])
    >>> list(layer_norm_bars(gradient_norms(m, by="module"), top_k=1).data[0].y)
    ['1', 'rest (1 module)']
    """
    layers = by_module[by_module["owns_parameters"] & by_module["own_norm"].notna()]
    layers = layers.assign(norm=layers["own_norm"])
    fig = go.Figure()
    if layers.empty:
        fig.add_annotation(text="No gradients yet: run a backward pass", showarrow=False,
                           x=0.5, y=0.5, xref="paper", yref="paper")
        fig.update_layout(height=200, xaxis=dict(visible=False), yaxis=dict(visible=False))
        return fig
    finite = layers["norm"].replace([np.inf, -np.inf], np.nan)
    order = layers.assign(_key=finite.fillna(np.inf)).sort_values("_key", ascending=False)
    top, rest = order.head(top_k), order.iloc[top_k:]
    names = [str(n) for n in top["name"]]
    values = [float(v) for v in top["norm"]]
    colours = ["#d62728" if s == "nonfinite" else "#1f77b4" for s in top["state"]]
    hover = [
        f"<b>{plot_text(n)}</b><br>norm {v:.4g}<br>{p} parameters, {e:,} elements<br>state {s}"
        for n, v, p, e, s in zip(names, values, top["parameters"], top["numel"], top["state"], strict=True)
    ]
    if len(rest):
        rest_norm = float(np.sqrt(np.square(rest["norm"].to_numpy(dtype=float)).sum()))
        label = f"rest ({len(rest)} module{'s' if len(rest) > 1 else ''})"
        names.append(label)
        values.append(rest_norm)
        colours.append("#aaaaaa")
        hover.append(f"<b>{label}</b><br>norm over all of them {rest_norm:.4g}")
    shown = [v if math.isfinite(v) and v > 0 else None for v in values]
    fig.add_trace(go.Bar(y=names, x=shown, orientation="h", marker_color=colours, hovertext=hover,
                         hovertemplate="%{hovertext}<extra></extra>", name="gradient norm"))
    fig.update_layout(
        title=f"Gradient norm per layer (top {min(top_k, len(layers))} of {len(layers)})",
        height=120 + 22 * len(names), margin=dict(l=10, r=10, t=40, b=40),
        xaxis=dict(title="L2 norm of the gradient (log)", type="log"),
        yaxis=dict(autorange="reversed"))
    return readable(log_decades(fig, shown))
