"""Which tensors are really the same tensor: alias groups, tie snapshots and conversion checks.

Three kinds of alias, found in one pass grouped by key (never by comparing every pair):

* ``same-object``: one Python object under several names (``parameters()`` yields it once);
* ``shared-storage``: different objects over exactly the same memory (counted twice);
* ``overlapping-view``: different objects whose bytes overlap partly.

Views of one storage whose bytes do not overlap are not aliases; they are reported as
information (:attr:`AliasAnalysis.disjoint`).
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import pandas as pd
import torch
from torch import nn

from .checks import require_module
from .devices import move_model
from .findings import Finding, InspectorError
from .locks import model_lock
from .summary import model_bytes

KINDS = ("same-object", "shared-storage", "overlapping-view")
_EXACT_OVERLAP_MAX_NUMEL = 1 << 22  # beyond this, strided views are compared by byte extent


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


# ---------------------------------------------------------------------------------------------
# Grouping


class _Obj:
    """One distinct tensor object and every name it has."""

    __slots__ = ("tensor", "names", "kinds", "order", "first", "span", "memkey")

    def __init__(self, tensor: torch.Tensor, first: int) -> None:
        self.tensor = tensor
        self.names: list[str] = []
        self.kinds: list[str] = []
        self.order: list[int] = []  # walk position of each name
        self.first = first
        self.span: tuple[int, int] = (0, 0)
        self.memkey: tuple = ()


def _named_tensors(model: nn.Module, include_buffers: bool) -> list[tuple[str, torch.Tensor, str]]:
    """``named_parameters(remove_duplicate=False)`` then ``named_buffers(remove_duplicate=False)``.

    For modules that do not override those two methods, both lists come from one walk of
    ``named_modules(remove_duplicate=False)`` (what the two methods do, each on its own walk).
    """
    cls = type(model)
    if cls.named_parameters is not nn.Module.named_parameters or \
            cls.named_buffers is not nn.Module.named_buffers:
        out = [(n, p, "parameter") for n, p in model.named_parameters(remove_duplicate=False)]
        if include_buffers:
            out += [(n, b, "buffer") for n, b in model.named_buffers(remove_duplicate=False)]
        return out
    params: list[tuple[str, torch.Tensor, str]] = []
    buffers: list[tuple[str, torch.Tensor, str]] = []
    for prefix, module in model.named_modules(remove_duplicate=False):
        dot = prefix + "." if prefix else ""
        for k, v in module._parameters.items():
            if v is not None:
                params.append((dot + k, v, "parameter"))
        if include_buffers:
            for k, v in module._buffers.items():
                if v is not None:
                    buffers.append((dot + k, v, "buffer"))
    return params + buffers


def _not_analysable(t: torch.Tensor) -> str | None:
    """Why ``t``'s memory cannot be compared, or None when it can."""
    if t.layout != torch.strided:
        return f"its layout is {str(t.layout).removeprefix('torch.')}"
    if t.is_quantized:
        return "it is quantized"
    return None


def _storage_key(t: torch.Tensor) -> tuple | None:
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    return (t.device.type, t.device.index, ptr)


def _span(t: torch.Tensor) -> tuple[int, int]:
    """Byte range [start, end) of ``t`` in its storage, from offset, shape and strides."""
    es = t.element_size()
    start = t.storage_offset() * es
    extent = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return start, start + extent * es


def _dense(t: torch.Tensor, span: tuple[int, int]) -> bool:
    return t.numel() * t.element_size() == span[1] - span[0]


def _byte_offsets(t: torch.Tensor) -> torch.Tensor:
    offsets = torch.tensor([t.storage_offset()], dtype=torch.long)
    for size, stride in zip(t.shape, t.stride()):
        offsets = (offsets[:, None] + torch.arange(size, dtype=torch.long)[None, :] * stride).reshape(-1)
    return offsets * t.element_size()


def _overlap(a: _Obj, b: _Obj) -> bool:
    """Exact for dense views and small strided ones; by byte extent otherwise."""
    (sa, ea), (sb, eb) = a.span, b.span
    if sa >= eb or sb >= ea:
        return False
    ta, tb = a.tensor, b.tensor
    if _dense(ta, a.span) and _dense(tb, b.span):
        return True
    if (ta.element_size() != tb.element_size()
            or max(ta.numel(), tb.numel()) > _EXACT_OVERLAP_MAX_NUMEL):
        return True
    return bool(torch.isin(_byte_offsets(ta), _byte_offsets(tb)).any())


def _union_by_elements(objs: list[_Obj], index: list[int], parent: list[int]) -> bool:
    """Join views that share an element: one sort of every element's byte offset, no pairs.

    Returns False (nothing done) when element sizes differ or the views are too big.
    """
    if len({o.tensor.element_size() for o in objs}) != 1 or \
            sum(o.tensor.numel() for o in objs) > _EXACT_OVERLAP_MAX_NUMEL:
        return False
    offsets = [_byte_offsets(o.tensor) for o in objs]
    labels = torch.cat([torch.full((len(off),), k, dtype=torch.long) for k, off in enumerate(offsets)])
    flat = torch.cat(offsets)
    order = torch.argsort(flat, stable=True)
    flat, labels = flat[order], labels[order]
    hit = (flat[1:] == flat[:-1]) & (labels[1:] != labels[:-1])
    for a, b in set(zip(labels[:-1][hit].tolist(), labels[1:][hit].tolist())):
        ra, rb = _find(parent, index[a]), _find(parent, index[b])
        if ra != rb:
            parent[ra] = rb
    return True


def _memkey(t: torch.Tensor, span: tuple[int, int]) -> tuple:
    """Equal keys mean exactly the same bytes."""
    if _dense(t, span):
        return span
    return (span[0], tuple(t.shape), tuple(t.stride()), t.element_size())


def _find(parent: list[int], i: int) -> int:
    while parent[i] != i:
        parent[i] = parent[parent[i]]
        i = parent[i]
    return i


def _components_of_storage(objs: list[_Obj]) -> list[list[_Obj]]:
    """Objects over one storage, split into groups of overlapping bytes (sweep, not all pairs)."""
    for o in objs:
        o.span = _span(o.tensor)
        o.memkey = _memkey(o.tensor, o.span)
    objs = sorted(objs, key=lambda o: (o.span[0], o.first))
    parent = list(range(len(objs)))
    clusters: list[list[int]] = []
    end = -1
    for i, o in enumerate(objs):
        if o.span[0] >= end:
            clusters.append([])
        clusters[-1].append(i)
        end = max(end, o.span[1])
    for cluster in clusters:
        by_mem: dict[tuple, int] = {}
        for i in cluster:
            j = by_mem.setdefault(objs[i].memkey, i)
            if j != i:
                parent[_find(parent, i)] = _find(parent, j)
        heads = list(by_mem.values())
        if len(heads) > 2 and _union_by_elements([objs[i] for i in heads], heads, parent):
            continue
        for x in range(len(heads)):  # distinct memories in one extent cluster: usually one or two
            for y in range(x + 1, len(heads)):
                a, b = heads[x], heads[y]
                if _find(parent, a) != _find(parent, b) and _overlap(objs[a], objs[b]):
                    parent[_find(parent, a)] = _find(parent, b)
    comps: dict[int, list[_Obj]] = {}
    for i, o in enumerate(objs):
        comps.setdefault(_find(parent, i), []).append(o)
    return sorted(comps.values(), key=lambda c: min(o.first for o in c))


def _make_group(objs: list[_Obj], memory_checked: bool) -> AliasGroup:
    objs = sorted(objs, key=lambda o: o.first)
    pairs = sorted(zip((i for o in objs for i in o.order), (n for o in objs for n in o.names),
                       (k for o in objs for k in o.kinds)))
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
    ``named_buffers(remove_duplicate=False)``, grouped by ``id()`` and then by storage;
    the tensors stay referenced while grouping, so ids are not reused.

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
    model = require_module(model, "alias_analysis")
    by_id: dict[int, _Obj] = {}
    order = 0
    names = unique_numel = with_aliases = 0
    for name, t, kind in _named_tensors(model, include_buffers):
        o = by_id.get(id(t))
        if o is None:
            o = by_id[id(t)] = _Obj(t, order)
            if kind == "parameter":
                unique_numel += t.numel()
        o.names.append(name)
        o.kinds.append(kind)
        o.order.append(order)
        if kind == "parameter":
            with_aliases += t.numel()
        order += 1
        names += 1
    findings: list[Finding] = []
    by_storage: dict[tuple, list[_Obj]] = {}
    identity: list[_Obj] = []
    meta = 0
    for o in by_id.values():
        t = o.tensor
        if t.is_meta:
            meta += 1
            identity.append(o)
            continue
        why = _not_analysable(t)
        key = None if why else _storage_key(t)
        if key is None:
            why = why or "it has no storage that can be read"
            findings.append(Finding("alias-not-analysable", "info", o.names[0],
                                    f"{o.names[0]}: {why}, so only object identity was checked for "
                                    "aliases; shared memory with other tensors is not detected"))
            identity.append(o)
        elif t.numel() == 0 or key[2] == 0:
            identity.append(o)  # no memory: zero-size tensors never alias by storage
        else:
            by_storage.setdefault(key, []).append(o)
    found: list[tuple[int, AliasGroup]] = [(o.first, _make_group([o], False))
                                           for o in identity if len(o.names) > 1]
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
    groups = [g for _, g in sorted(found, key=lambda pair: pair[0])]
    identity_only = meta > 0 and not by_storage
    if meta:
        findings.append(Finding(
            "alias-identity-only", "info", "",
            f"{meta} tensors are on the meta device and hold no memory: aliases were found by object "
            "identity only (same-object); shared storage and overlapping views cannot be seen there"))
    return AliasAnalysis(tuple(groups), tuple(disjoint), tuple(findings), identity_only, names,
                         unique_numel, with_aliases)


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


# ---------------------------------------------------------------------------------------------
# Snapshots, comparisons, re-tying


@dataclass(frozen=True)
class TensorLayout:
    """Where one name's tensor sat at snapshot time (``obj`` numbers the group's objects)."""

    name: str
    tensor_kind: str
    obj: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    dtype: str

    def to_dict(self) -> dict:
        return {"name": self.name, "tensor_kind": self.tensor_kind, "obj": self.obj,
                "shape": list(self.shape), "stride": list(self.stride),
                "storage_offset": self.storage_offset, "dtype": self.dtype}


@dataclass(frozen=True)
class TieSnapshot:
    """The ties of a model at one moment, by name (holds no tensors).

    ``unique_numel`` is what ``parameters()`` counted then.
    """

    groups: tuple[AliasGroup, ...]
    layouts: tuple[tuple[TensorLayout, ...], ...]
    unique_numel: int
    identity_only: bool

    def to_dict(self) -> dict:
        return {"groups": [g.to_dict() for g in self.groups],
                "layouts": [[lay.to_dict() for lay in g] for g in self.layouts],
                "unique_numel": self.unique_numel, "identity_only": self.identity_only}


def snapshot_ties(model: nn.Module, include_buffers: bool = True) -> TieSnapshot:
    """Record every alias group of ``model`` to compare with later (see :func:`compare_ties`).

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> s = snapshot_ties(m)
    >>> len(s.groups), s.unique_numel
    (1, 4)
    """
    model = require_module(model, "snapshot_ties")
    analysis = alias_analysis(model, include_buffers)
    current = _current_tensors(model, include_buffers)
    layouts = []
    for g in analysis.groups:
        ids: dict[int, int] = {}
        rows = []
        for name, kind in zip(g.names, g.tensor_kinds):
            t = current[name]
            rows.append(TensorLayout(name, kind, ids.setdefault(id(t), len(ids)), tuple(t.shape),
                                     tuple(t.stride()) if t.layout == torch.strided else (),
                                     t.storage_offset() if t.layout == torch.strided else 0,
                                     str(t.dtype).removeprefix("torch.")))
        layouts.append(tuple(rows))
    return TieSnapshot(analysis.groups, tuple(layouts), analysis.unique_numel, analysis.identity_only)


def _current_tensors(model: nn.Module, include_buffers: bool = True) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for name, t, _ in _named_tensors(model, include_buffers):
        out.setdefault(name, t)
    return out


@dataclass(frozen=True)
class GroupOutcome:
    """What became of one alias group after a conversion.

    ``outcome`` is ``"kept"``, ``"weakened"`` (one object became several objects over one
    memory) or ``"broken"`` (the names no longer share memory). ``same_storage`` is None
    where memory cannot be compared (meta device).
    """

    names: tuple[str, ...]
    kind: str
    outcome: str
    same_object: bool
    same_storage: bool | None
    objects: int
    storages: int | None
    missing: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"names": list(self.names), "kind": self.kind, "outcome": self.outcome,
                "same_object": self.same_object, "same_storage": self.same_storage,
                "objects": self.objects, "storages": self.storages, "missing": list(self.missing)}


def _outcome(group: AliasGroup, layouts: tuple[TensorLayout, ...],
             current: dict[str, torch.Tensor]) -> GroupOutcome:
    missing = tuple(n for n in group.names if n not in current)
    tensors = [current[n] for n in group.names if n in current]
    objects = len({id(t) for t in tensors})
    checkable = bool(tensors) and all(not t.is_meta and _not_analysable(t) is None for t in tensors)
    storages = same_memory = None
    if checkable:
        keys = [_storage_key(t) for t in tensors]
        storages = len(set(keys))
        if storages == 1:
            # same relative layout as at snapshot time: offsets moved together, shapes/strides kept
            base = {lay.name: lay for lay in layouts}
            t0, l0 = tensors[0], base[group.names[0]] if group.names[0] in base else None
            same_memory = l0 is not None and all(
                tuple(t.shape) == base[n].shape and tuple(t.stride()) == base[n].stride
                and t.storage_offset() - t0.storage_offset() == base[n].storage_offset - l0.storage_offset
                for n, t in zip([n for n in group.names if n in current], tensors))
    same_object = objects == 1 and not missing
    if missing:
        outcome = "broken"
    elif group.kind == "same-object" and objects == 1:
        outcome = "kept"
    elif same_memory:
        outcome = "weakened" if group.kind == "same-object" else "kept"
    else:
        outcome = "broken"
    return GroupOutcome(group.names, group.kind, outcome, same_object,
                        None if storages is None else storages == 1, objects, storages, missing)


def _unique_numel(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _outcome_findings(outcomes: list[GroupOutcome], before: int, after: int) -> list[Finding]:
    findings = []
    change = f"the unique parameter count went from {before} to {after}"
    for o in outcomes:
        names = ", ".join(o.names)
        if o.missing:
            findings.append(Finding("tie-broken", "error", o.names[0],
                                    f"{', '.join(o.missing)} no longer exist, so the alias group {names} "
                                    f"is broken; {change}"))
        elif o.outcome == "broken":
            where = ("separate memory" if o.storages is None
                     else f"{o.storages} separate storages" if o.storages > 1
                     else "different places in one storage")
            findings.append(Finding(
                "tie-broken", "error", o.names[0],
                f"{names} ({o.kind}) no longer share memory: {o.objects} objects over {where}; "
                f"{change}. Training updates each copy on its own. Re-tie them (retie) or convert "
                "with move_model, which keeps ties."))
        elif o.outcome == "weakened":
            findings.append(Finding(
                "tie-weakened", "warning", o.names[0],
                f"{names} were one object and are now {o.objects} objects over one memory; {change}. "
                "parameters() and an optimizer count the weight twice, and the next conversion can "
                "split the memory. Re-tie them (retie)."))
    return findings


def compare_ties(snapshot: TieSnapshot, model: nn.Module) -> list[Finding]:
    """Findings for every tie of ``snapshot`` that ``model`` no longer has.

    ``tie-broken`` (error) where names that shared memory no longer do; ``tie-weakened``
    (warning) where one object became several objects over one memory. Each finding names
    every alias and the change of the unique parameter count.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> s = snapshot_ties(m)
    >>> m[1].weight = nn.Parameter(m[0].weight.detach().clone())
    >>> [f.code for f in compare_ties(s, m)]
    ['tie-broken']
    """
    model = require_module(model, "compare_ties")
    if not isinstance(snapshot, TieSnapshot):
        raise InspectorError(f"compare_ties needs a TieSnapshot from snapshot_ties(model), got "
                             f"{type(snapshot).__name__}")
    current = _current_tensors(model)
    outcomes = [_outcome(g, lay, current) for g, lay in zip(snapshot.groups, snapshot.layouts)]
    return _outcome_findings(outcomes, snapshot.unique_numel, _unique_numel(model))


def _set_tensor(model: nn.Module, name: str, kind: str, value: torch.Tensor) -> None:
    prefix, _, leaf = name.rpartition(".")
    module = model.get_submodule(prefix) if prefix else model
    if kind == "parameter":
        module._parameters[leaf] = value
    else:
        module._buffers[leaf] = value


def retie(model: nn.Module, snapshot: TieSnapshot) -> list[Finding]:
    """Restore, in place, the ties of ``snapshot`` that ``model`` lost.

    ``same-object`` groups get the object of ``names[0]`` under every name; ``shared-storage``
    and ``overlapping-view`` groups get views of ``names[0]``'s memory at the recorded relative
    offsets. Values of the other names are dropped for those of ``names[0]``. Nothing is changed
    unless every group can be re-tied.

    Raises:
        InspectorError: a name is missing, or shapes/dtypes no longer agree with the snapshot.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> s = snapshot_ties(m)
    >>> m[1].weight = nn.Parameter(m[0].weight.detach().clone())
    >>> [f.code for f in retie(m, s)], m[0].weight is m[1].weight
    (['tie-restored'], True)
    """
    model = require_module(model, "retie")
    if not isinstance(snapshot, TieSnapshot):
        raise InspectorError(f"retie needs a TieSnapshot from snapshot_ties(model), got "
                             f"{type(snapshot).__name__}")
    with model_lock(model):
        current = _current_tensors(model)
        todo = []
        for g, layouts in zip(snapshot.groups, snapshot.layouts):
            o = _outcome(g, layouts, current)
            if o.outcome == "kept":
                continue
            if o.missing:
                raise InspectorError(f"cannot re-tie {', '.join(g.names)}: {', '.join(o.missing)} no "
                                     "longer exist in the model; nothing was changed")
            for lay in layouts:
                t = current[lay.name]
                dtype = str(t.dtype).removeprefix("torch.")
                if tuple(t.shape) != lay.shape:
                    raise InspectorError(f"cannot re-tie {lay.name}: its shape is {tuple(t.shape)} but it "
                                         f"was {lay.shape} when tied; nothing was changed")
                if dtype != str(current[g.names[0]].dtype).removeprefix("torch."):
                    raise InspectorError(
                        f"cannot re-tie {lay.name} ({dtype}) to {g.names[0]} "
                        f"({str(current[g.names[0]].dtype).removeprefix('torch.')}): dtypes differ; "
                        "convert both to one dtype first; nothing was changed")
            todo.append((g, layouts, o))
        findings = []
        for g, layouts, o in todo:
            keep = current[g.names[0]]
            objs: dict[int, torch.Tensor] = {0: keep}
            if g.kind != "same-object":
                _check_views_fit(g, layouts, keep)
            for lay in layouts[1:]:
                if lay.obj in objs:
                    new = objs[lay.obj]
                else:
                    offset = keep.storage_offset() + lay.storage_offset - layouts[0].storage_offset
                    view = torch.empty(0, dtype=keep.dtype, device=keep.device).set_(
                        keep.untyped_storage(), offset, lay.shape, lay.stride)
                    old = current[lay.name]
                    if isinstance(old, nn.Parameter):
                        old.data = view
                        new = old
                    else:
                        new = view
                    objs[lay.obj] = new
                _set_tensor(model, lay.name, lay.tensor_kind, new)
            findings.append(Finding("tie-restored", "info", g.names[0],
                                    f"re-tied {', '.join(g.names)} ({g.kind}, was {o.outcome}) to the "
                                    f"memory of {g.names[0]}"))
        return findings


def _check_views_fit(g: AliasGroup, layouts: tuple[TensorLayout, ...], keep: torch.Tensor) -> None:
    if keep.is_meta:
        raise InspectorError(f"cannot re-tie {', '.join(g.names)} ({g.kind}) on the meta device: "
                             "there is no memory to share; materialise the model first")
    n = keep.untyped_storage().nbytes() // keep.element_size()
    for lay in layouts:
        offset = keep.storage_offset() + lay.storage_offset - layouts[0].storage_offset
        extent = 1 + sum((s - 1) * st for s, st in zip(lay.shape, lay.stride))
        if offset < 0 or offset + extent > n:
            raise InspectorError(f"cannot re-tie {lay.name} as a view of {g.names[0]}: it would reach "
                                 "outside that tensor's storage; nothing was changed")


# ---------------------------------------------------------------------------------------------
# Conversions


@contextmanager
def overwrite_on_conversion(value: bool = True) -> Iterator[None]:
    """Set torch's process-wide overwrite-on-conversion flag for a block, and restore it after."""
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(value)
    try:
        yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)


@dataclass(frozen=True)
class Conversion:
    """A named conversion to try on a copy of a model; ``run(model, device)`` returns the result."""

    name: str
    label: str
    run: Callable[[nn.Module, torch.device], nn.Module] = field(repr=False)
    needs_data: bool = False   # reads or writes values (not possible on the meta device)
    allocates: float = 0.0     # memory it allocates, as a multiple of the model's bytes


def _to_dtype(dtype: torch.dtype, overwrite: bool) -> Callable[[nn.Module, torch.device], nn.Module]:
    def run(m: nn.Module, dev: torch.device) -> nn.Module:
        with overwrite_on_conversion(overwrite):
            return m.to(dtype)
    return run


def _to_device(m: nn.Module, dev: torch.device) -> nn.Module:
    with overwrite_on_conversion(True):
        return m.to(dev)


def _to_device_plain(m: nn.Module, dev: torch.device) -> nn.Module:
    return m.to(dev)


def _cuda(m: nn.Module, dev: torch.device) -> nn.Module:
    if dev.type != "cuda":
        raise InspectorError(f"Module.cuda() moves to a CUDA device; the target here is {dev}. "
                             "Pick a cuda:N device for this conversion.")
    return m.cuda(dev)


def _move(dtype: torch.dtype) -> Callable[[nn.Module, torch.device], nn.Module]:
    def run(m: nn.Module, dev: torch.device) -> nn.Module:
        with overwrite_on_conversion(True):
            return move_model(m, dtype=dtype)
    return run


def _move_device(m: nn.Module, dev: torch.device) -> nn.Module:
    with overwrite_on_conversion(True):
        return move_model(m, device=dev)


def _assign(m: nn.Module, dev: torch.device) -> nn.Module:
    m.load_state_dict(m.state_dict(), assign=True)
    return m


def _safetensors_file(m: nn.Module, dev: torch.device) -> nn.Module:
    from safetensors.torch import load_file, save_file

    state = m.state_dict()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        try:
            save_file(state, path)
        except RuntimeError:
            # save_file refuses tensors that share memory; the usual workaround is a copy of each
            save_file({k: v.detach().clone().contiguous() for k, v in state.items()}, path)
        m.load_state_dict(load_file(path, device=str(dev)), assign=True)
    return m


def _safetensors_model(m: nn.Module, dev: torch.device) -> nn.Module:
    from safetensors.torch import load_model, save_model

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        save_model(m, path)
        load_model(m, path, device=str(dev))
    return m


def _to_empty(m: nn.Module, dev: torch.device) -> nn.Module:
    return m.to_empty(device=dev)


CONVERSIONS: dict[str, Conversion] = {c.name: c for c in [
    Conversion("to-float64", ".to(float64), default flags", _to_dtype(torch.float64, False), allocates=2),
    Conversion("to-float64-overwrite", "overwrite flag + .to(float64)", _to_dtype(torch.float64, True),
               allocates=2),
    Conversion("to-float32-overwrite", "overwrite flag + .to(float32)", _to_dtype(torch.float32, True),
               allocates=1),
    Conversion("to-device", ".to(device), default flags (each buffer moved on its own: views break)",
               _to_device_plain, needs_data=True, allocates=1),
    Conversion("cuda", "Module.cuda(), default flags (each buffer moved on its own: views break)", _cuda,
               needs_data=True, allocates=1),
    Conversion("to-device-overwrite", "overwrite flag + .to(device)", _to_device, needs_data=True,
               allocates=1),
    Conversion("move-model-float64", "overwrite flag + move_model(dtype=float64)", _move(torch.float64),
               allocates=2),
    Conversion("move-model-float32", "overwrite flag + move_model(dtype=float32)", _move(torch.float32),
               allocates=1),
    Conversion("move-model-device", "overwrite flag + move_model(device)", _move_device, needs_data=True,
               allocates=1),
    Conversion("load-state-dict-assign", "load_state_dict(own state dict, assign=True)", _assign),
    Conversion("safetensors-file", "safetensors save_file/load_file + load_state_dict(assign=True)",
               _safetensors_file, needs_data=True, allocates=2),
    Conversion("safetensors-model", "safetensors save_model/load_model", _safetensors_model,
               needs_data=True, allocates=2),
    Conversion("deepcopy", "copy.deepcopy", lambda m, dev: copy.deepcopy(m), allocates=1),
    Conversion("to-empty", "to_empty(device)", _to_empty, needs_data=True, allocates=1),
]}


@dataclass(frozen=True)
class ConversionResult:
    """What one conversion did to every alias group of a copy of the model.

    ``error`` is set (and ``outcomes`` empty) when the conversion could not run; ``retied``
    and ``after_retie`` are filled when a re-tie was asked for.
    """

    conversion: str
    label: str
    device: str
    unique_before: int
    unique_after: int | None
    outcomes: tuple[GroupOutcome, ...]
    findings: tuple[Finding, ...]
    error: str | None = None
    retied: tuple[Finding, ...] = ()
    unique_after_retie: int | None = None
    after_retie: tuple[GroupOutcome, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None and all(o.outcome == "kept" for o in self.outcomes)

    def to_dict(self) -> dict:
        return {"conversion": self.conversion, "label": self.label, "device": self.device,
                "unique_before": self.unique_before, "unique_after": self.unique_after,
                "outcomes": [o.to_dict() for o in self.outcomes],
                "findings": [f.to_dict() for f in self.findings], "error": self.error,
                "retied": [f.to_dict() for f in self.retied],
                "unique_after_retie": self.unique_after_retie,
                "after_retie": [o.to_dict() for o in self.after_retie]}

    def to_frame(self) -> pd.DataFrame:
        """One row per alias group (one row with the error, if it failed)."""
        return _result_rows([self])


def _target_device(model: nn.Module, device: str | torch.device | None) -> torch.device:
    if device is not None:
        from .devices import resolve_device

        return resolve_device(device)
    for t in [*model.parameters(), *model.buffers()]:
        return torch.device("cpu") if t.is_meta else t.device
    return torch.device("cpu")


def conversion_check(model: nn.Module, conversion: str, device: str | torch.device | None = None,
                     retie_after: bool = False, max_bytes: int = 4 << 30) -> ConversionResult:
    """Run ``conversion`` on a deep copy of ``model`` and report what became of each tie.

    The model itself is never changed; torch's overwrite flag is restored whatever happens.

    Args:
        model: the model to check.
        conversion: a key of :data:`CONVERSIONS`.
        device: target of ``to-device``, ``cuda``, ``to-device-overwrite``, ``to-empty`` and the
            safetensors loads
            (default: the model's device; cpu for a meta model).
        retie_after: also run :func:`retie` on the converted copy and report the result.
        max_bytes: refuse conversions that would allocate more than this.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> r = conversion_check(m, "to-float64-overwrite")
    >>> r.outcomes[0].outcome, r.unique_before, r.unique_after
    ('broken', 4, 8)
    """
    model = require_module(model, "conversion_check")
    conv = CONVERSIONS.get(conversion)
    if conv is None:
        raise InspectorError(f"unknown conversion {conversion!r}; choose one of {', '.join(CONVERSIONS)}")
    dev = _target_device(model, device)
    snap = snapshot_ties(model)
    base = dict(conversion=conv.name, label=conv.label, device=str(dev), unique_before=snap.unique_numel)
    on_meta = any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    size = model_bytes(model)
    need = (size if on_meta and conv.needs_data else 0) + (0 if on_meta else size * (1 + conv.allocates))
    if on_meta and conv.needs_data and conv.name not in ("to-empty", "to-device-overwrite"):
        return ConversionResult(**base, unique_after=None, outcomes=(), findings=(),
                                error="the model is on the meta device: it has no values to save or load")
    if need > max_bytes:
        return ConversionResult(**base, unique_after=None, outcomes=(), findings=(),
                                error=f"would allocate about {need / 2**30:.1f} GiB, more than the "
                                      f"{max_bytes / 2**30:.1f} GiB allowed for a conversion check")
    with model_lock(model):
        work = copy.deepcopy(model)
    try:
        work = conv.run(work, dev)
    except Exception as exc:  # noqa: BLE001 - a failing conversion is a result, not a crash
        msg = str(exc).strip().splitlines()
        return ConversionResult(**base, unique_after=None, outcomes=(), findings=(),
                                error=f"{type(exc).__name__}: {msg[0] if msg else ''}")
    current = _current_tensors(work)
    outcomes = [_outcome(g, lay, current) for g, lay in zip(snap.groups, snap.layouts)]
    after = _unique_numel(work)
    findings = [replace(f, message=f"After {base['label']}: {f.message}")
                for f in _outcome_findings(outcomes, snap.unique_numel, after)]
    retied: list[Finding] = []
    after_retie: list[GroupOutcome] = []
    unique_retie = None
    if retie_after:
        try:
            retied = retie(work, snap)
        except InspectorError as exc:
            retied = [Finding("retie-refused", "warning", "", str(exc))]
        current = _current_tensors(work)
        after_retie = [_outcome(g, lay, current) for g, lay in zip(snap.groups, snap.layouts)]
        unique_retie = _unique_numel(work)
    return ConversionResult(**base, unique_after=after, outcomes=tuple(outcomes), findings=tuple(findings),
                            retied=tuple(retied), unique_after_retie=unique_retie,
                            after_retie=tuple(after_retie))


_TABLE_COLUMNS = ["conversion", "group", "outcome", "same_object", "same_storage", "unique", "error"]


def _result_rows(results: list[ConversionResult], retied: bool = False) -> pd.DataFrame:
    rows = []
    for r in results:
        outcomes = r.after_retie if retied else r.outcomes
        unique = r.unique_after_retie if retied else r.unique_after
        label = r.label + (" + retie" if retied else "")
        if r.error is not None or not outcomes:
            rows.append({"conversion": label, "group": "", "outcome": "error" if r.error else "no ties",
                         "same_object": None, "same_storage": None, "unique": unique, "error": r.error})
        for o in outcomes:
            rows.append({"conversion": label, "group": ", ".join(o.names), "outcome": o.outcome,
                         "same_object": o.same_object, "same_storage": o.same_storage, "unique": unique,
                         "error": None})
    return pd.DataFrame(rows, columns=_TABLE_COLUMNS)


def conversion_table(model: nn.Module, conversions: list[str] | None = None,
                     device: str | torch.device | None = None,
                     retie_after: bool = False) -> tuple[pd.DataFrame, list[ConversionResult]]:
    """The conversion check for several conversions, as one table with a ``before`` row per group.

    Columns: ``conversion, group, outcome, same_object, same_storage, unique, error``.
    With ``retie_after``, each conversion that split a tie gets a second row set after re-tying.
    """
    snap = snapshot_ties(model)
    current = _current_tensors(model)
    before = [_outcome(g, lay, current) for g, lay in zip(snap.groups, snap.layouts)]
    results = [conversion_check(model, name, device, retie_after)
               for name in (conversions or list(CONVERSIONS))]
    start = ConversionResult("before", "before", str(_target_device(model, device)), snap.unique_numel,
                             snap.unique_numel, tuple(before), ())
    frames = [_result_rows([start])]
    for r in results:
        frames.append(_result_rows([r]))
        if retie_after and r.retied:
            frames.append(_result_rows([r], retied=True))
    table = pd.concat(frames, ignore_index=True)
    table.loc[table["conversion"] == "before", "outcome"] = "-"
    return table, results
