"""Device-map figures: a treemap of the module tree coloured by device, and bytes per device.

Both take the tables of :mod:`inspector.placement` (audit, placement, usage) and return a
``go.Figure``. Big models are aggregated so a figure never has thousands of marks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ..utils.escaping import escaped_figure, plot_text
from ..utils.labels import ROOT_LABEL
from ..utils.units import format_bytes
from .palette import FIXED_COLOURS, WHOLE_MODEL, bytes_axis, device_colours, device_key, readable

RED = "#D62728"
ROOT = ROOT_LABEL
FIXED: dict[Any, str] = {**FIXED_COLOURS, None: FIXED_COLOURS["(none)"]}


def _depth(name: str) -> int:
    return 0 if not name else name.count(".") + 1


def _ancestor(name: str, depth: int) -> str:
    return ".".join(name.split(".")[:depth])


def _leaf_of(name: str, kind: str, depth: int) -> tuple[str, str]:
    """The leaf a tensor row is drawn in, and that leaf's parent, at the given depth."""
    if _depth(name) <= depth:
        return name, name.rpartition(".")[0]
    anc = _ancestor(name, depth)
    return f"{anc} [{kind}s]", anc


def _choose_depth(names: list[str], max_nodes: int) -> int:
    deepest = max((_depth(n) for n in names), default=1)
    best = 1
    for depth in range(1, deepest + 1):
        nodes: set[str] = set()
        for n in names:
            leaf, parent = _leaf_of(n, "x", depth)
            nodes.add(leaf)
            while parent:
                nodes.add(parent)
                parent = parent.rpartition(".")[0]
        if len(nodes) > max_nodes:
            break
        best = depth
    return best


def _tree_nodes(table: pd.DataFrame, depth: int) -> dict[str, dict[str, Any]]:
    """Boxes of the treemap by id: parent, bytes, devices, finding codes, kind and tensor count.

    Devices and codes of a tensor are added to every box above it; bytes count each tensor
    object once (aliases add none).
    """
    nodes: dict[str, dict[str, Any]] = {ROOT: {"parent": "", "bytes": 0, "devices": set(), "codes": set(),
                                               "kind": "module", "count": 0}}

    def node(nid: str, parent: str, kind: str) -> dict[str, Any]:
        if nid not in nodes:
            nodes[nid] = {"parent": parent or ROOT, "bytes": 0, "devices": set(), "codes": set(),
                          "kind": kind, "count": 0}
            if parent and parent not in nodes:
                node(parent, parent.rpartition(".")[0], "module")
        return nodes[nid]

    for row in table.itertuples(index=False):
        leaf, parent = _leaf_of(row.name, row.kind, depth)
        n = node(leaf, parent, row.kind)
        n["bytes"] += 0 if row.alias_of is not None else int(row.bytes)
        n["devices"].add(row.device)
        n["count"] += 1
        codes = set(row.finding.split(",")) if isinstance(row.finding, str) else set()
        p: str | None = leaf
        while p:
            nodes[p]["codes"] |= codes
            nodes[p]["devices"].add(row.device)
            p = nodes[p]["parent"]
    return nodes


def _treemap_marks(nodes: dict[str, dict[str, Any]], colours: Mapping[Any, str]) -> dict[str, list[Any]]:
    """One entry per box for each treemap property (ids, parents, labels, values, colours, hover)."""
    marks: dict[str, list[Any]] = {k: [] for k in ("ids", "parents", "labels", "values", "fill", "line",
                                                   "width", "pattern", "hover")}
    for nid, n in nodes.items():
        leaf = n["kind"] != "module"
        devs = n["devices"]
        dev = next(iter(devs)) if len(devs) == 1 else "mixed"
        marks["ids"].append(nid)
        marks["parents"].append("" if nid == ROOT else n["parent"])
        short = WHOLE_MODEL if nid == "" else nid if nid == ROOT else nid.rpartition(".")[2]
        marks["labels"].append(("▦ " if n["kind"] == "buffer" else "") + short)
        marks["values"].append(n["bytes"] if leaf else 0)
        marks["fill"].append(colours.get(dev, FIXED.get(dev, FIXED["mixed"])))
        marks["line"].append(RED if n["codes"] else "#FFFFFF")
        marks["width"].append(3 if n["codes"] and leaf else 2 if n["codes"] else 1)
        marks["pattern"].append("x" if n["kind"] == "buffer" else "")
        where = ", ".join(sorted(map(str, devs)))
        extra = f"<br>tensors: {n['count']}" if leaf and n["count"] > 1 else ""
        found = f"<br><b>{plot_text(', '.join(sorted(n['codes'])))}</b>" if n["codes"] else ""
        marks["hover"].append(f"{plot_text(nid)}<br>{n['kind']}<br>device: {plot_text(where)}{extra}{found}")
    return marks


@escaped_figure
def placement_treemap(table: pd.DataFrame, max_nodes: int = 400, title: str = "") -> go.Figure:
    """The module tree sized by bytes, coloured by device; buffers hatched; findings in red.

    Args:
        table: an audit or placement table (columns name, kind, device, finding, bytes, alias_of).
        max_nodes: above this many boxes, tensors below a depth are summed per module (parameters
            and buffers in separate boxes, so buffers stay visible).
        title: figure title.

    >>> import pandas as pd
    >>> t = pd.DataFrame({"name": ["a.weight", "a.buf"], "kind": ["parameter", "buffer"],
    ...                   "device": [0, None], "finding": [None, "buffer-unplaced"],
    ...                   "bytes": [64, 16], "alias_of": [None, None]})
    >>> len(placement_treemap(t).data[0].ids)
    4
    """
    nodes = _tree_nodes(table, _choose_depth(table["name"].tolist(), max_nodes))
    devices = sorted({d for n in nodes.values() for d in n["devices"] if d is not None}, key=str)
    colours = device_colours(devices)
    marks = _treemap_marks(nodes, colours)
    marker = dict(colors=marks["fill"], line=dict(color=marks["line"], width=marks["width"]),
                  pattern=dict(shape=marks["pattern"]))
    fig = go.Figure(go.Treemap(
        ids=marks["ids"], parents=marks["parents"], labels=marks["labels"], values=marks["values"],
        branchvalues="remainder", marker=marker, hovertext=marks["hover"], hoverinfo="text", maxdepth=4))
    legend = "  ".join(f"<span style='color:{c}'>■</span> {plot_text(str(d))}" for d, c in colours.items())
    fig.update_layout(
        title=title or None, margin=dict(t=40 if title else 10, l=5, r=5, b=30), height=560,
        annotations=[dict(text=f"{legend}  ▦ hatched = buffer  <span style='color:{RED}'>■</span> red edge "
                          "= finding", showarrow=False, x=0, y=-0.05, xref="paper", yref="paper",
                          xanchor="left")])
    return fig


AXIS_ROOM_PX = 64  # left and bottom room for an axis title beside its tick labels (automargin only adds)


@escaped_figure
def usage_bars(usage: pd.DataFrame, title: str = "") -> go.Figure:
    """Parameter and buffer bytes per device, stacked, with the budget marked and room kept free.

    Each device has its own colour (the same in every figure); parameters are solid, buffers
    hatched, room kept free light and dotted.

    >>> import pandas as pd
    >>> u = pd.DataFrame({"device": [0, "cpu"], "parameter_bytes": [10, 5], "buffer_bytes": [2, 0],
    ...                   "total_bytes": [12, 5], "budget_bytes": [20, 50], "reserved_bytes": [4, 0]})
    >>> [t.name for t in usage_bars(u).data if t.showlegend is not False]
    ['parameters', 'buffers', 'kept free', 'budget']
    >>> [t.marker.color for t in usage_bars(u).data if t.name == "parameters"][:2]  # GPU 0, cpu
    ['#4C78A8', '#8C8C8C']
    """
    x = [device_key(d) for d in usage["device"]]
    fig = go.Figure()
    for col, name, shape, opacity in (("parameter_bytes", "parameters", "", 1.0),
                                      ("buffer_bytes", "buffers", "x", 1.0),
                                      ("reserved_bytes", "kept free", ".", 0.35)):
        vals = [0 if pd.isna(v) else int(v) for v in usage[col]]
        # one trace per device (a bar's pattern takes one colour), one grey legend entry per kind
        for dev, v in zip(x, vals, strict=True):
            fig.add_bar(x=[dev], y=[v], name=name, legendgroup=name, showlegend=False, opacity=opacity,
                        marker=dict(color=device_colours([dev])[dev], line=dict(color="#333333", width=0.5),
                                    pattern=dict(shape=shape, fgcolor="#333333")),
                        hovertext=[format_bytes(v)], hoverinfo="text+name")
        fig.add_bar(x=[x[0]] if x else [], y=[0] if x else [], name=name, legendgroup=name, opacity=opacity,
                    marker=dict(color="#BBBBBB", line=dict(color="#333333", width=0.5),
                                pattern=dict(shape=shape, fgcolor="#333333")), hoverinfo="skip")
    budgets = [None if pd.isna(v) else int(v) for v in usage["budget_bytes"]]
    fig.add_scatter(x=x, y=budgets, mode="markers", name="budget",
                    marker=dict(symbol="line-ew-open", size=44, color=RED, line=dict(width=3, color=RED)),
                    hovertext=[format_bytes(v) if v is not None else "no budget" for v in budgets],
                    hoverinfo="text+name")
    fig.update_layout(barmode="stack", title=title or None,
                      xaxis_title="device (colour: the device, as in every figure)", xaxis_type="category",
                      height=360, margin=dict(t=40 if title else 10, l=AXIS_ROOM_PX, r=5, b=AXIS_ROOM_PX))
    fig.update_yaxes(title_standoff=8)
    fig.update_xaxes(title_standoff=8)
    stacked = usage[["parameter_bytes", "buffer_bytes", "reserved_bytes"]].fillna(0).sum(axis=1)
    return readable(bytes_axis(fig, [*stacked, *budgets]))


@escaped_figure
def usage_side_by_side(ours: pd.DataFrame, theirs: pd.DataFrame,
                       labels: Mapping[str, str] | None = None) -> go.Figure:
    """Total bytes per device for two plans side by side (ours, accelerate's).

    The x axis groups the bars by plan; each device keeps its own colour (one trace per
    device, so the legend lists devices), as in the treemap and the bytes-per-device bars.

    >>> import pandas as pd
    >>> a = pd.DataFrame({"device": [0, "cpu"], "total_bytes": [10, 5]})
    >>> b = pd.DataFrame({"device": [0], "total_bytes": [15]})
    >>> [(t.name, list(t.x[0])) for t in usage_side_by_side(a, b).data]
    [('0', ['plan_device_map', 'accelerate']), ('cpu', ['plan_device_map'])]
    """
    labels = dict(labels or {"ours": "plan_device_map", "theirs": "accelerate"})
    per_device: dict[str, tuple[list[str], list[int]]] = {}
    for df, key in ((ours, "ours"), (theirs, "theirs")):
        for d, b in zip(df["device"], df["total_bytes"], strict=True):
            plans, values = per_device.setdefault(device_key(d), ([], []))
            plans.append(labels[key])
            values.append(0 if pd.isna(b) else int(b))
    fig = go.Figure()
    for dev, (plans, values) in per_device.items():
        fig.add_bar(x=[plans, [dev] * len(plans)], y=values, name=dev,
                    marker=dict(color=device_colours([dev])[dev], line=dict(color="#333333", width=0.5)),
                    hovertext=[format_bytes(v) for v in values], hoverinfo="text+name")
    fig.update_layout(
        barmode="group", height=320, legend_title_text="device",
        margin=dict(t=10, l=AXIS_ROOM_PX, r=5, b=AXIS_ROOM_PX),  # two rows of x labels, the bytes title
    )
    fig.update_yaxes(title_standoff=8)
    return readable(bytes_axis(fig, [v for _, values in per_device.values() for v in values]))
