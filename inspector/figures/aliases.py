"""The alias graph: modules, the tensors they hold, and alias groups drawn in one colour."""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go
from torch import nn

from ..aliases import AliasGroup, alias_groups
from ..escaping import escaped_figure, plot_text

PALETTE = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#e377c2", "#8c564b",
           "#bcbd22", "#7f7f7f"]


@dataclass(frozen=True)
class GraphData:
    """Nodes and edges of the alias graph, before layout.

    ``nodes`` maps a node key to (label, kind, group index or -1); keys are module names
    (``"m:" + name``) and tensor objects (``"t:" + first name``). ``tree`` edges go from a
    parent module to a child module or to a tensor's first holder; ``extra`` edges go from
    every other holder of an aliased tensor. ``left_out`` counts what a big model hides.
    """

    nodes: dict[str, tuple[str, str, int]]
    tree: list[tuple[str, str]]
    extra: list[tuple[str, str, int]]
    left_out_modules: int
    left_out_tensors: int


def graph_data(model: nn.Module, groups: list[AliasGroup] | None = None,
               max_nodes: int = 300) -> GraphData:
    """Modules and tensors of ``model``; only aliased tensors and their paths when it is big.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> d = graph_data(m)
    >>> len(d.nodes), d.extra
    (4, [('m:1', 't:0.weight', 0)])
    """
    groups = alias_groups(model) if groups is None else groups
    group_of: dict[str, int] = {n: i for i, g in enumerate(groups) for n in g.names}
    modules = [name for name, _ in model.named_modules(remove_duplicate=False)]
    holders: dict[int, list[tuple[str, str]]] = {}  # id(tensor) -> [(module, full name)]
    tensors: dict[int, str] = {}
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = prefix + "." if prefix else ""
        for store in (module._parameters, module._buffers):
            for k, v in store.items():
                if v is None:
                    continue
                tensors.setdefault(id(v), dot + k)
                holders.setdefault(id(v), []).append((prefix, dot + k))
    total = len(modules) + len(tensors)
    big = total > max_nodes
    if big:
        keep_t = {i: n for i, n in tensors.items()
                  if any(full in group_of for _, full in holders[i])}
        keep_m = {""}
        for i in keep_t:
            for mod, _ in holders[i]:
                parts = mod.split(".") if mod else []
                keep_m.update(".".join(parts[:k]) for k in range(len(parts) + 1))
        if not keep_t:  # nothing aliased: show the top level
            keep_m.update(m for m in modules if m and "." not in m)
        mods = [m for m in modules if m in keep_m]
    else:
        keep_t, mods = tensors, modules
    nodes: dict[str, tuple[str, str, int]] = {}
    tree: list[tuple[str, str]] = []
    for m in dict.fromkeys(mods):
        nodes["m:" + m] = (m or "(root)", "module", -1)
        if m:
            parent = m.rpartition(".")[0]
            tree.append(("m:" + parent, "m:" + m))
    extra: list[tuple[str, str, int]] = []
    for i, first in keep_t.items():
        names = [full for _, full in holders[i]]
        g = next((group_of[n] for n in names if n in group_of), -1)
        key = "t:" + first
        nodes[key] = (first, "buffer" if _is_buffer(model, holders[i][0]) else "tensor", g)
        tree.append(("m:" + holders[i][0][0], key))
        for mod, _ in holders[i][1:]:
            extra.append(("m:" + mod, key, g))
    left_m = len(set(modules)) - len({k for k in nodes if k.startswith("m:")})
    return GraphData(nodes, tree, extra, left_m, len(tensors) - len(keep_t))


def _is_buffer(model: nn.Module, holder: tuple[str, str]) -> bool:
    mod, full = holder
    module = model.get_submodule(mod) if mod else model
    return full.rpartition(".")[2] in module._buffers


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
def alias_graph_figure(model: nn.Module, groups: list[AliasGroup] | None = None,
                       max_nodes: int = 300) -> go.Figure:
    """A plotly graph: modules, edges to the tensors they hold, each alias group in one colour.

    On models with more than ``max_nodes`` modules and tensors only the aliased tensors and
    the paths from the root to them are drawn, and the title says how many were left out.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> len(alias_graph_figure(m).data) > 0
    True
    """
    groups = alias_groups(model) if groups is None else groups
    data = graph_data(model, groups, max_nodes)
    pos = _tree_layout(data)
    fig = go.Figure()
    ex, ey = _segments([(a, b) for a, b in data.tree], pos)
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", line=dict(color="#c7c7c7", width=1),
                             hoverinfo="skip", showlegend=False))
    for kind, symbol, color in (("module", "square", "#636363"), ("tensor", "circle", "#bdbdbd"),
                                ("buffer", "diamond", "#bdbdbd")):
        keys = [k for k, (_, kd, g) in data.nodes.items() if kd == kind and g < 0 and k in pos]
        if keys:
            fig.add_trace(_nodes(keys, data, pos, symbol, color, f"{kind}s", show_text=False))
    holders = {a for a, _, _ in data.extra} | {a for a, b in data.tree if data.nodes[b][2] >= 0}
    holders = sorted(k for k in holders if k in pos and k != "m:")
    if holders:  # name the modules that hold an aliased tensor
        fig.add_trace(go.Scatter(
            x=[pos[k][0] for k in holders], y=[pos[k][1] for k in holders], mode="text",
            text=[data.nodes[k][0] for k in holders], textposition="top center",
            hoverinfo="skip", showlegend=False))
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
        x=[pos[k][0] for k in keys], y=[pos[k][1] for k in keys],
        mode="markers+text" if show_text else "markers",
        marker=dict(symbol=symbol, color=color, size=size, line=dict(color="white", width=1)),
        text=labels if show_text else None,
        textposition="bottom center", hovertext=[f"{data.nodes[k][1]}: {plot_text(lab)}" for k, lab in zip(keys, labels)],
        hoverinfo="text", name=name, legendgroup=group, showlegend=True)
