"""The alias graph: modules, the tensors they hold, and alias groups drawn in one colour."""

from __future__ import annotations

import plotly.graph_objects as go

from ..aliases import GraphData
from ..utils.escaping import escaped_figure, plot_text
from ..utils.labels import ROOT_LABEL

PALETTE = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#e377c2", "#8c564b",
           "#bcbd22", "#7f7f7f"]


def _tree_layout(data: GraphData) -> dict[str, tuple[float, float]]:
    """Leaves in depth-first order along x, parents centred above their children."""
    children: dict[str, list[str]] = {}
    for parent, child in data.tree:
        children.setdefault(parent, []).append(child)
    pos: dict[str, tuple[float, float]] = {}
    next_x = 0.0
    stack: list[tuple[str, int, bool]] = [("m:", 0, False)]
    while stack:  # iterative post-order, so deep models do not hit the recursion limit
        node, depth, done = stack.pop()
        kids = children.get(node, [])
        if not kids:
            pos[node] = (next_x, -depth)
            next_x += 1
        elif done:
            xs = [pos[k][0] for k in kids]
            pos[node] = ((min(xs) + max(xs)) / 2, -depth)
        else:
            stack.append((node, depth, True))
            stack.extend((k, depth + 1, False) for k in reversed(kids))
    return pos


@escaped_figure
def alias_graph_figure(data: GraphData) -> go.Figure:
    """A plotly graph: modules, edges to the tensors they hold, each alias group in one colour.

    ``data`` comes from :func:`inspector.aliases.graph_data`; on a big model it holds only the
    aliased tensors and the paths from the root to them, and the title says how many were left out.

    >>> from torch import nn
    >>> from inspector.aliases import graph_data
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> len(alias_graph_figure(graph_data(m)).data) > 0
    True
    """
    groups = data.groups
    pos = _tree_layout(data)
    fig = go.Figure()
    ex, ey = _segments([(a, b) for a, b in data.tree], pos)
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#c7c7c7", width=1),
                             hoverinfo="skip", showlegend=False))
    for kind, symbol, color, name in (("module", "square", "#636363", "modules"),
                                      ("tensor", "circle", "#bdbdbd", "parameters"),
                                      ("buffer", "diamond", "#bdbdbd", "buffers")):
        keys = [k for k, (_, kd, g) in data.nodes.items() if kd == kind and g < 0 and k in pos]
        if keys:
            fig.add_trace(_nodes(keys, data, pos, symbol, color, name, show_text=False))
    fig.add_trace(_module_labels(data, pos))
    for i, g in enumerate(groups):
        color = PALETTE[i % len(PALETTE)]
        edges = [(a, b) for a, b, gi in data.extra if gi == i]
        if edges:
            x, y = _segments(edges, pos)
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", line=dict(color=color, width=2),
                                     hoverinfo="skip", showlegend=False, legendgroup=f"g{i}"))
        keys = [k for k, (_, _, gi) in data.nodes.items() if gi == i and k in pos]
        if keys:
            label = f"{g.kind}: {', '.join(g.names)}"
            fig.add_trace(_nodes(keys, data, pos, "circle", color, label[:80], show_text=True,
                                 size=13, group=f"g{i}"))
    title = f"{len(groups)} alias group{'s' if len(groups) != 1 else ''}"
    if data.left_out_modules or data.left_out_tensors:
        shown = ("only aliased tensors and their paths" if groups
                 else "only the top-level modules")
        title += (f" — large model: showing {shown}; {data.left_out_modules} modules and "
                  f"{data.left_out_tensors} tensors left out")
    width = max(1, max((x for x, _ in pos.values()), default=1))
    pad = max(2.0, 0.08 * width)  # room for the names of aliased tensors at the edges
    fig.update_layout(title=title, showlegend=True, hovermode="closest", height=520,
                      margin=dict(l=10, r=10, t=50, b=10), plot_bgcolor="white",
                      legend=dict(orientation="h", yanchor="top", y=-0.02),
                      xaxis=dict(visible=False, range=[-pad, width + pad]),
                      yaxis=dict(visible=False))
    return fig


PLOT_PX = 1100    # drawing width of the figure in a wide page at 1440 px
CHAR_PX = 6.6     # one character of the 11 px label font


def _module_labels(data: GraphData, pos: dict[str, tuple[float, float]]) -> go.Scatter:
    """Every module's short name above its square, cut to the room between it and its neighbours."""
    keys = [k for k, (_, kind, _) in data.nodes.items() if kind == "module" and k in pos]
    xs = [x for x, _ in pos.values()]
    span = max(xs, default=1) - min(xs, default=0) or 1
    px = PLOT_PX / (span * 1.2)  # pixels per unit of x, the padding included
    rows: dict[float, list[float]] = {}
    for k in keys:
        rows.setdefault(pos[k][1], []).append(pos[k][0])
    texts = []
    for k in keys:
        x, y = pos[k]
        others = [abs(o - x) for o in rows[y] if o != x]
        room = int((min(others, default=span) * px - 6) / CHAR_PX)
        short = data.nodes[k][0].rpartition(".")[2] or ROOT_LABEL
        texts.append(short if len(short) <= room else short[:room - 1] + "…" if room >= 3 else "")
    return go.Scatter(
        x=[pos[k][0] for k in keys],
        y=[pos[k][1] + 0.12 for k in keys],
        mode="text",
        text=texts,
        textposition="top center",
        textfont=dict(size=11, color="#333333"),
        hoverinfo="skip",
        showlegend=False,
    )


def _segments(edges: list[tuple[str, str]], pos: dict[str, tuple[float, float]]) -> tuple[list, list]:
    xs: list[float | None] = []
    ys: list[float | None] = []
    for a, b in edges:
        if a in pos and b in pos:
            xs += [pos[a][0], pos[b][0], None]
            ys += [pos[a][1], pos[b][1], None]
    return xs, ys


def _nodes(keys: list[str], data: GraphData, pos: dict[str, tuple[float, float]], symbol: str,
           color: str, name: str, show_text: bool, size: int = 9, group: str | None = None) -> go.Scatter:
    labels = [data.nodes[k][0] for k in keys]
    return go.Scatter(
        x=[pos[k][0] for k in keys],
        y=[pos[k][1] for k in keys],
        mode="markers+text" if show_text else "markers",
        marker=dict(symbol=symbol, color=color, size=size, line=dict(color="white", width=1)),
        text=labels if show_text else None,
        textposition="bottom center",
        textfont=dict(size=11),
        hovertext=[f"{data.nodes[k][1]}: {plot_text(lab)}" for k, lab in zip(keys, labels, strict=True)],
        hoverinfo="text",
        name=name,
        legendgroup=group,
        showlegend=True,
    )
