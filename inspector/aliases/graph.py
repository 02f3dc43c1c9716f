"""The alias graph as data: modules, the tensors they hold, and which alias group each tensor is in."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from ..inventory import TensorInventory, tensor_inventory
from ..utils.labels import ROOT_LABEL
from .groups import AliasGroup, analyse_inventory


@dataclass(frozen=True)
class GraphData:
    """Nodes and edges of the alias graph, before layout.

    ``nodes`` maps a node key to (label, kind, group index or -1); keys are module names
    (``"m:" + name``) and tensor objects (``"t:" + first name``); kind is ``"module"``,
    ``"tensor"`` (a parameter) or ``"buffer"``. ``tree`` edges go from a parent module to a
    child module or to a tensor's first holder; ``extra`` edges go from every other holder of
    an aliased tensor. ``left_out`` counts what a big model hides. ``groups`` are the alias
    groups the indices refer to.
    """

    nodes: dict[str, tuple[str, str, int]]
    tree: list[tuple[str, str]]
    extra: list[tuple[str, str, int]]
    left_out_modules: int
    left_out_tensors: int
    groups: tuple[AliasGroup, ...] = ()


def graph_data(model: nn.Module, groups: list[AliasGroup] | tuple[AliasGroup, ...] | None = None,
               max_nodes: int = 300) -> GraphData:
    """Modules and tensors of ``model``; only aliased tensors and their paths when it is big.

    Args:
        model: any ``nn.Module``; it is not changed.
        groups: its alias groups (found here when None).
        max_nodes: above this many modules and tensors, keep only the aliased tensors and
            the modules on the paths to them.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> d = graph_data(m)
    >>> len(d.nodes), d.extra
    (4, [('m:1', 't:0.weight', 0)])
    """
    inv = tensor_inventory(model, what="graph_data")
    groups = analyse_inventory(inv).groups if groups is None else tuple(groups)
    return inventory_graph(inv, groups, max_nodes)


def _holders(inv: TensorInventory) -> tuple[dict[int, list[tuple[str, str, str]]], dict[int, str]]:
    """Object number -> [(module, full name, kind)] and -> first name, module by module
    (a module's parameters, then its buffers), as ``named_modules`` meets them."""
    rank = {m: i for i, m in reversed(list(enumerate(inv.modules)))}
    order = sorted(range(len(inv.entries)),
                   key=lambda i: (rank.get(inv.entries[i].module, -1), inv.entries[i].kind != "parameter", i))
    holders: dict[int, list[tuple[str, str, str]]] = {}
    first: dict[int, str] = {}
    for i in order:
        e = inv.entries[i]
        first.setdefault(e.obj, e.name)
        holders.setdefault(e.obj, []).append((e.module, e.name, e.kind))
    return holders, first


def _kept(holders: dict[int, list[tuple[str, str, str]]], tensors: dict[int, str], modules: list[str],
          group_of: dict[str, int]) -> tuple[dict[int, str], list[str]]:
    """On a big model: the aliased tensors, and the modules on the paths from the root to them."""
    keep_t = {i: n for i, n in tensors.items() if any(full in group_of for _, full, _ in holders[i])}
    keep_m = {""}
    for i in keep_t:
        for mod, _, _ in holders[i]:
            parts = mod.split(".") if mod else []
            keep_m.update(".".join(parts[:k]) for k in range(len(parts) + 1))
    if not keep_t:  # nothing aliased: show the top level
        keep_m.update(m for m in modules if m and "." not in m)
    return keep_t, [m for m in modules if m in keep_m]


def inventory_graph(inv: TensorInventory, groups: tuple[AliasGroup, ...], max_nodes: int = 300) -> GraphData:
    """:func:`graph_data` of a model already walked by :func:`~inspector.inventory.tensor_inventory`."""
    group_of: dict[str, int] = {n: i for i, g in enumerate(groups) for n in g.names}
    modules = list(inv.modules)
    holders, tensors = _holders(inv)
    if len(modules) + len(tensors) > max_nodes:
        keep_t, mods = _kept(holders, tensors, modules, group_of)
    else:
        keep_t, mods = tensors, modules
    nodes: dict[str, tuple[str, str, int]] = {}
    tree: list[tuple[str, str]] = []
    for m in dict.fromkeys(mods):
        nodes["m:" + m] = (m or ROOT_LABEL, "module", -1)
        if m:
            tree.append(("m:" + m.rpartition(".")[0], "m:" + m))
    extra: list[tuple[str, str, int]] = []
    for i, first in keep_t.items():
        names = [full for _, full, _ in holders[i]]
        g = next((group_of[n] for n in names if n in group_of), -1)
        key = "t:" + first
        nodes[key] = (first, "buffer" if holders[i][0][2] == "buffer" else "tensor", g)
        tree.append(("m:" + holders[i][0][0], key))
        for mod, _, _ in holders[i][1:]:
            extra.append(("m:" + mod, key, g))
    left_m = len(set(modules)) - len({k for k in nodes if k.startswith("m:")})
    return GraphData(nodes, tree, extra, left_m, len(tensors) - len(keep_t), groups)
