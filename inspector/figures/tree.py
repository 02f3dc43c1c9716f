"""The module tree as a treemap: one box per module, sized by bytes, coloured by a lens."""

from __future__ import annotations

import math
from typing import Any

import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from ..structure.tree import LENSES, MIXED, NONE, ModuleTree
from ..utils.escaping import escaped_figure, plot_text
from ..utils.labels import ROOT_LABEL
from ..utils.units import format_bytes
from .palette import FIXED_COLOURS, device_colour

CATEGORY = ["#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#EECA3B", "#9D755D",
            "#FF9DA6", "#BAB0AC"]
EMPTY = "#F2F2F2"
RED = "#D62728"
STATES = {"captured": "#54A24B", "mutated after capture": "#E45756", "not captured": "#D9D9D9"}
LENS_COLUMN = {
    "device": "device",
    "module kind": "cls",
    "dtype": "dtype",
    "gradient norm": "grad_norm",
    "alias group": "alias_group",
    "captured": "captured",
}


def node_id(module: str) -> str:
    """The figure's id of a module: ``"/"`` for the model, ``"/h.0"`` for ``h.0`` (never empty)."""
    return "/" + module


def _category_colours(lens: str, values: list[str]) -> dict[str, str]:
    if lens == "captured":
        return dict(STATES)
    fixed = {NONE: EMPTY, MIXED: FIXED_COLOURS["mixed"], "several": "#7F7F7F"}
    rest = [v for v in dict.fromkeys(values) if v not in fixed]
    if lens == "device":
        return {**fixed, **{v: device_colour(v) for v in rest}}
    return {**fixed, **{v: CATEGORY[i % len(CATEGORY)] for i, v in enumerate(sorted(rest))}}


def _norm_colours(norms: list[float]) -> tuple[list[str], str]:
    """Viridis on log10 of the norm (grey where there is none), and the legend text."""
    logs = [math.log10(n) for n in norms if n == n and n > 0]
    if not logs:
        return [EMPTY] * len(norms), "no gradients: run a backward pass on the Flatten map page"
    lo, hi = min(logs), max(logs)
    span = hi - lo or 1.0
    colours = [sample_colorscale("Viridis", (math.log10(n) - lo) / span)[0] if n == n and n > 0 else EMPTY
               for n in norms]
    return colours, (f"log scale, <span style='color:#440154'>■</span> {10 ** lo:.3g} … "
                     f"<span style='color:#FDE725'>■</span> {10 ** hi:.3g}; light grey: no gradient")


def lens_colours(tree: ModuleTree, lens: str) -> tuple[list[str], str]:
    """One colour per module row for ``lens`` (one of :data:`~inspector.structure.tree.LENSES`) and a legend
    line."""
    if lens not in LENSES:
        raise ValueError(f"unknown lens {lens!r}; choose one of {', '.join(LENSES)}")
    column = tree.modules[LENS_COLUMN[lens]].tolist()
    if lens == "gradient norm":
        return _norm_colours([float(v) for v in column])
    colours = _category_colours(lens, [str(v) for v in column])
    shown = [v for v in colours if v in set(map(str, column))]
    legend = "  ".join(f"<span style='color:{colours[v]}'>■</span> {plot_text(v)}" for v in shown[:12])
    return [colours[str(v)] for v in column], legend + ("  …" if len(shown) > 12 else "")


def _hover(row: Any) -> str:
    norm = "—" if row.grad_norm != row.grad_norm else f"{row.grad_norm:.4g}"
    return (f"<b>{plot_text(row.id or ROOT_LABEL)}</b> ({plot_text(row.cls)})<br>{format_bytes(row.bytes)}"
            f"<br>device: {plot_text(row.device)} · dtype: {plot_text(row.dtype)}<br>grad norm: {norm}"
            f" · alias: {plot_text(row.alias_group)}<br>{row.captured}")


def shown_level(tree: ModuleTree, focus: str) -> str:
    """The module the figure opens at for ``focus``: itself, or its nearest ancestor that holds
    bytes (a module whose tensors are all counted elsewhere, a tied head, has no box of its own).

    >>> from torch import nn
    >>> from inspector.structure.tree import module_tree
    >>> m = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU()))
    >>> shown_level(module_tree(m), "1.0"), shown_level(module_tree(m), "0")
    ('', '0')
    """
    sizes = dict(zip(tree.modules["id"], tree.modules["bytes"], strict=True))
    node = focus
    while node and not sizes.get(node):
        node = node.rpartition(".")[0]
    return node


@escaped_figure
def module_tree_figure(tree: ModuleTree, lens: str = "device", focus: str = "", max_depth: int = 4,
                       height: int = 460) -> go.Figure:
    """A treemap of the module tree: area by bytes (each tensor once), colour by ``lens``.

    Args:
        tree: :func:`inspector.module_tree` of the model.
        lens: ``"device"``, ``"module kind"`` (the class), ``"dtype"``, ``"gradient norm"``,
            ``"alias group"`` or ``"captured"``.
        focus: module name the figure starts zoomed on and outlines in red (``""``: the whole model);
            one without bytes of its own opens at its nearest ancestor that has some.
        max_depth: levels drawn at once below the focus (click a box to go deeper).
        height: pixels.

    >>> from torch import nn
    >>> from inspector.structure.tree import module_tree
    >>> fig = module_tree_figure(module_tree(nn.Sequential(nn.Linear(2, 2), nn.ReLU())), "dtype")
    >>> list(fig.data[0].ids), list(fig.data[0].values)
    (['/', '/0', '/1'], [24, 24, 0])
    """
    m = tree.modules
    colours, legend = lens_colours(tree, lens)
    parents = ["" if p is None or p != p else node_id(p) for p in m["parent"]]
    start = shown_level(tree, focus)
    chosen = [i == focus for i in m["id"]] if focus else None
    line = dict(width=[3 if c else 1 for c in chosen], color=[RED if c else "#FFFFFF" for c in chosen]) \
        if chosen else dict(width=1, color="#FFFFFF")
    trace = dict(
        type="treemap",
        ids=[node_id(i) for i in m["id"]],
        parents=parents,
        labels=m["label"].tolist(),
        values=m["bytes"].tolist(),
        branchvalues="total",
        marker=dict(colors=colours, line=line),
        hovertext=[_hover(r) for r in m.itertuples()],
        hoverinfo="text",
        maxdepth=max_depth,
        pathbar=dict(visible=True, thickness=22, textfont=dict(size=13)),
        tiling=dict(pad=2),
        textinfo="label",
        **({"level": plot_text(node_id(start))} if start else {}),
    )
    # Every value above is built here from known types: plotly's per-element validation of ~1,000
    # colours and labels would take most of the time on a 70B model.
    fig = go.Figure(data=[trace], _validate=False)
    fig.update_layout(height=height, margin=dict(t=24, l=5, r=5, b=40),
                      annotations=[dict(text=f"{plot_text(lens)}: {legend}", showarrow=False, x=0, y=-0.02,
                                        xref="paper", yref="paper", xanchor="left", yanchor="top")])
    return fig
