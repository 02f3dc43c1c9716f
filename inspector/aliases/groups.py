"""Alias groups: which names of a model's parameters and buffers hold one memory.

Three kinds of alias, found in one pass grouped by key (never by comparing every pair):

* ``same-object``: one Python object under several names (``parameters()`` yields it once);
* ``shared-storage``: different objects over exactly the same memory (counted twice);
* ``overlapping-view``: different objects whose bytes overlap partly.

Views of one storage whose bytes do not overlap are not aliases; they are reported as
information (:attr:`AliasAnalysis.disjoint`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
from torch import nn

from ..inventory import TensorInventory, tensor_inventory
from ..utils.findings import Finding
from .memory import _components_of_storage, _memkey, _not_analysable, _Obj, _span

KINDS = ("same-object", "shared-storage", "overlapping-view")


# ---------------------------------------------------------------------------------------------
# Data


@dataclass(frozen=True)
class AliasGroup:
    """Two or more names that alias one memory.

    Attributes:
        names: every name, in ``named_parameters()`` then ``named_buffers()`` order; ``names[0]``
            is the name ``named_parameters()`` keeps.
        kind: ``"same-object"``, ``"shared-storage"`` or ``"overlapping-view"`` (the loosest link).
        numel: elements of the shared memory, counted once.
        nbytes: bytes of the shared memory, counted once.
        objects: how many distinct tensor objects the names hold.
        tensor_kinds: ``"parameter"`` or ``"buffer"`` for each name.
        shape, dtype, device: of ``names[0]``.
        memory_checked: False where there is no memory to compare (meta device, sparse or
            quantized tensors): then only object identity was checked.
    """

    names: tuple[str, ...]
    kind: str
    numel: int
    nbytes: int
    objects: int
    tensor_kinds: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str
    device: str
    memory_checked: bool = True

    def to_dict(self) -> dict:
        return {"names": list(self.names), "kind": self.kind, "numel": self.numel,
                "nbytes": self.nbytes, "objects": self.objects,
                "tensor_kinds": list(self.tensor_kinds), "shape": list(self.shape),
                "dtype": self.dtype, "device": self.device, "memory_checked": self.memory_checked}


@dataclass(frozen=True)
class DisjointViews:
    """Views of one storage whose bytes do not overlap: not aliases, shown as information.

    ``regions`` holds the names of each region (names within one region alias each other).
    """

    regions: tuple[tuple[str, ...], ...]
    storage_nbytes: int
    device: str

    def to_dict(self) -> dict:
        return {"regions": [list(r) for r in self.regions], "storage_nbytes": self.storage_nbytes,
                "device": self.device}


@dataclass(frozen=True)
class AliasAnalysis:
    """Everything :func:`alias_analysis` found.

    ``identity_only`` is True when no tensor had memory to compare (a model on the meta
    device): then only ``same-object`` groups can be found, and ``findings`` says so.
    """

    groups: tuple[AliasGroup, ...]
    disjoint: tuple[DisjointViews, ...]
    findings: tuple[Finding, ...]
    identity_only: bool
    names: int
    unique_numel: int
    numel_with_aliases: int

    def to_dict(self) -> dict:
        return {"groups": [g.to_dict() for g in self.groups],
                "disjoint": [d.to_dict() for d in self.disjoint],
                "findings": [f.to_dict() for f in self.findings],
                "identity_only": self.identity_only, "names": self.names,
                "unique_numel": self.unique_numel, "numel_with_aliases": self.numel_with_aliases}

    def to_frame(self) -> pd.DataFrame:
        return groups_frame(self.groups)


def groups_frame(groups: tuple[AliasGroup, ...] | list[AliasGroup]) -> pd.DataFrame:
    """One row per alias group, for tables."""
    cols = ["names", "kind", "objects", "numel", "nbytes", "shape", "dtype", "device", "memory_checked"]
    rows = [{"names": ", ".join(g.names), "kind": g.kind, "objects": g.objects, "numel": g.numel,
             "nbytes": g.nbytes, "shape": str(tuple(g.shape)), "dtype": g.dtype, "device": g.device,
             "memory_checked": g.memory_checked} for g in groups]
    return pd.DataFrame(rows, columns=cols)


def _make_group(objs: list[_Obj], memory_checked: bool) -> AliasGroup:
    objs = sorted(objs, key=lambda o: o.first)
    pairs = sorted(zip((i for o in objs for i in o.order), (n for o in objs for n in o.names),
                       (k for o in objs for k in o.kinds), strict=True))
    first = objs[0].tensor
    if len(objs) == 1:
        kind = "same-object"
    elif len({o.memkey for o in objs}) == 1:
        kind = "shared-storage"
    else:
        kind = "overlapping-view"
    if kind == "overlapping-view":
        spans = sorted(o.span for o in objs)
        nbytes, cur_s, cur_e = 0, spans[0][0], spans[0][1]
        for s, e in spans[1:]:
            if s > cur_e:
                nbytes += cur_e - cur_s
                cur_s, cur_e = s, e
            else:
                cur_e = max(cur_e, e)
        nbytes += cur_e - cur_s
        numel = nbytes // max(first.element_size(), 1)
    else:
        numel = first.numel()
        nbytes = numel * first.element_size()
    return AliasGroup(
        names=tuple(n for _, n, _ in pairs), kind=kind, numel=numel, nbytes=nbytes,
        objects=len(objs), tensor_kinds=tuple(k for _, _, k in pairs), shape=tuple(first.shape),
        dtype=str(first.dtype).removeprefix("torch."), device=str(first.device),
        memory_checked=memory_checked)


def alias_analysis(model: nn.Module, include_buffers: bool = True) -> AliasAnalysis:
    """Alias groups plus what could not be analysed, disjoint views and element counts.

    One pass over ``named_parameters(remove_duplicate=False)`` and
    ``named_buffers(remove_duplicate=False)`` (:func:`~inspector.inventory.tensor_inventory`),
    grouped by ``id()`` and then by storage; the tensors stay referenced while grouping, so
    ids are not reused.

    Args:
        model: any ``nn.Module``; it is not changed.
        include_buffers: also group buffers (and parameter-buffer aliases).

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> a = alias_analysis(m)
    >>> a.unique_numel, a.numel_with_aliases, a.groups[0].names
    (4, 8, ('0.weight', '1.weight'))
    """
    return analyse_inventory(tensor_inventory(model, include_buffers, what="alias_analysis"))


def analyse_inventory(inv: TensorInventory) -> AliasAnalysis:
    """:func:`alias_analysis` of a model already walked by :func:`~inspector.inventory.tensor_inventory`."""
    aliased = inv.aliased
    objects = [aliased.get(o) or (i,) for o, i in enumerate(inv.unique)]  # entry indices of each object
    findings: list[Finding] = []
    by_storage: dict[tuple, list[int]] = {}
    identity: list[int] = []
    meta = unique_numel = with_aliases = 0
    for o, idx in enumerate(objects):
        e = inv.entries[idx[0]]
        t = e.tensor
        if e.kind == "parameter":  # parameters() counts it once; every parameter name counts it again
            n = t.numel()
            unique_numel += n
            with_aliases += n if len(idx) == 1 else n * sum(inv.entries[i].kind == "parameter" for i in idx)
        if t.is_meta:
            meta += 1
            identity.append(o)
            continue
        why = _not_analysable(t)
        if why is None and t.numel() == 0:
            identity.append(o)  # no memory: zero-size tensors never alias by storage
        elif why is not None or e.storage_key is None:
            why = why or "it has no storage that can be read"
            findings.append(Finding("alias-not-analysable", "info", e.name,
                                    f"{e.name}: {why}, so only object identity was checked for "
                                    "aliases; shared memory with other tensors is not detected"))
            identity.append(o)
        else:
            by_storage.setdefault(e.storage_key, []).append(o)
    found = [(objects[o][0], _make_group([_obj(inv, objects[o])], False))
             for o in identity if len(objects[o]) > 1]
    more, disjoint = _storage_groups({key: [_obj(inv, objects[o]) for o in objs]
                                      for key, objs in by_storage.items()
                                      if len(objs) > 1 or len(objects[objs[0]]) > 1})
    groups = [g for _, g in sorted(found + more, key=lambda pair: pair[0])]
    if meta:
        findings.append(Finding(
            "alias-identity-only", "info", "",
            f"{meta} tensors are on the meta device and hold no memory: aliases were found by object "
            "identity only (same-object); shared storage and overlapping views cannot be seen there"))
    return AliasAnalysis(tuple(groups), tuple(disjoint), tuple(findings), meta > 0 and not by_storage,
                         len(inv.entries), unique_numel, with_aliases)


def _obj(inv: TensorInventory, idx: tuple[int, ...]) -> _Obj:
    """The :class:`_Obj` of one tensor object from the indices of its entries."""
    o = _Obj(inv.entries[idx[0]].tensor, idx[0])
    o.names = [inv.entries[i].name for i in idx]
    o.kinds = [inv.entries[i].kind for i in idx]
    o.order = list(idx)
    return o


def _storage_groups(by_storage: dict[tuple, list[_Obj]]) -> tuple[list[tuple[int, AliasGroup]],
                                                                  list[DisjointViews]]:
    """Alias groups (with the walk position they sort by) and disjoint views, storage by storage."""
    found: list[tuple[int, AliasGroup]] = []
    disjoint: list[DisjointViews] = []
    for objs in by_storage.values():
        if len(objs) == 1:
            if len(objs[0].names) > 1:
                o = objs[0]
                o.span = _span(o.tensor)
                o.memkey = _memkey(o.tensor, o.span)
                found.append((o.first, _make_group(objs, True)))
            continue
        comps = _components_of_storage(objs)
        for comp in comps:
            if len(comp) > 1 or len(comp[0].names) > 1:
                found.append((min(o.first for o in comp), _make_group(comp, True)))
        if len(comps) > 1:
            t = objs[0].tensor
            regions = tuple(tuple(n for o in sorted(c, key=lambda o: o.first) for n in o.names)
                            for c in comps)
            disjoint.append(DisjointViews(regions, t.untyped_storage().nbytes(), str(t.device)))
    return found, disjoint


def alias_groups(model: nn.Module, include_buffers: bool = True) -> list[AliasGroup]:
    """Every group of two or more names that alias, over parameters and buffers.

    Kinds: ``same-object`` (one object, several names), ``shared-storage`` (different
    objects over exactly the same memory), ``overlapping-view`` (bytes overlap partly).
    Disjoint views of one storage are not aliases. On the meta device only identity can
    be checked (``AliasGroup.memory_checked`` is False); :func:`alias_analysis` says more.

    Args:
        model: any ``nn.Module``; it is not changed.
        include_buffers: also group buffers (and parameter-buffer aliases).

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> [(g.names, g.kind) for g in alias_groups(m)]
    [(('0.weight', '1.weight'), 'same-object')]
    """
    return list(alias_analysis(model, include_buffers).groups)
