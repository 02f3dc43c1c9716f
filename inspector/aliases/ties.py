"""Tie snapshots: record every alias group, compare a model with the record, and re-tie in place."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..inventory import TensorInventory, storage_key, tensor_inventory
from ..utils.checks import require_module
from ..utils.findings import Finding, InspectorError
from ..utils.locks import model_lock
from .groups import AliasGroup, analyse_inventory
from .memory import _not_analysable


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

    ``unique_numel`` is what ``parameters()`` counted then; ``tensor_names`` every tensor name
    the model had (so :func:`retie` can tell a snapshot of another model).
    """

    groups: tuple[AliasGroup, ...]
    layouts: tuple[tuple[TensorLayout, ...], ...]
    unique_numel: int
    identity_only: bool
    tensor_names: frozenset[str] = frozenset()

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
    return snapshot_inventory(tensor_inventory(model, include_buffers, what="snapshot_ties"))


def snapshot_inventory(inv: TensorInventory) -> TieSnapshot:
    """:func:`snapshot_ties` of a model already walked by :func:`~inspector.inventory.tensor_inventory`."""
    analysis = analyse_inventory(inv)
    current = inv.tensors()
    layouts = []
    for g in analysis.groups:
        ids: dict[int, int] = {}
        rows = []
        for name, kind in zip(g.names, g.tensor_kinds, strict=True):
            t = current[name]
            rows.append(TensorLayout(name, kind, ids.setdefault(id(t), len(ids)), tuple(t.shape),
                                     tuple(t.stride()) if t.layout == torch.strided else (),
                                     int(t.storage_offset()) if t.layout == torch.strided else 0,
                                     str(t.dtype).removeprefix("torch.")))
        layouts.append(tuple(rows))
    return TieSnapshot(analysis.groups, tuple(layouts), analysis.unique_numel, analysis.identity_only,
                       frozenset(current))


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
        keys = [storage_key(t) for t in tensors]
        storages = len(set(keys))
        if storages == 1:
            # same relative layout as at snapshot time: offsets moved together, shapes/strides kept
            base = {lay.name: lay for lay in layouts}
            t0, l0 = tensors[0], base[group.names[0]] if group.names[0] in base else None
            same_memory = l0 is not None and all(
                tuple(t.shape) == base[n].shape and tuple(t.stride()) == base[n].stride
                and t.storage_offset() - t0.storage_offset() == base[n].storage_offset - l0.storage_offset
                for n, t in zip([n for n in group.names if n in current], tensors, strict=True))
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


def _outcome_findings(outcomes: list[GroupOutcome], before: int, after: int) -> list[Finding]:
    findings = []
    change = f"the unique parameter count went from {before:,} to {after:,}"
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
    inv = tensor_inventory(model, what="compare_ties")
    if not isinstance(snapshot, TieSnapshot):
        raise InspectorError(f"compare_ties needs a TieSnapshot from snapshot_ties(model), got "
                             f"{type(snapshot).__name__}")
    return _outcome_findings(outcomes(snapshot, inv.tensors()), snapshot.unique_numel, inv.unique_numel())


def outcomes(snapshot: TieSnapshot, current: dict[str, torch.Tensor]) -> list[GroupOutcome]:
    """What became of each group of ``snapshot``, given the tensors a model holds now (name -> tensor)."""
    return [_outcome(g, lay, current) for g, lay in zip(snapshot.groups, snapshot.layouts, strict=True)]


def _set_tensor(model: nn.Module, name: str, kind: str, value: torch.Tensor) -> None:
    prefix, _, leaf = name.rpartition(".")
    module = model.get_submodule(prefix) if prefix else model
    if kind == "parameter":
        # A tensor from this slot (a Parameter, or a plain tensor someone stored there):
        # the stubs say Parameter.
        module._parameters[leaf] = value  # type: ignore[assignment]
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
        current = tensor_inventory(model).tensors()
        _refuse_other_model(snapshot, current)
        todo = [(g, layouts, o) for g, layouts, o in zip(snapshot.groups, snapshot.layouts,
                                                         outcomes(snapshot, current), strict=True)
                if o.outcome != "kept"]
        for g, layouts, o in todo:
            _check_retie(g, layouts, o, current)
        return [_retie_group(model, g, layouts, o, current) for g, layouts, o in todo]


def _refuse_other_model(snapshot: TieSnapshot, current: dict[str, torch.Tensor]) -> None:
    """Raise when ``snapshot`` was taken of another model: over half its tensor names are not in this one."""
    names = snapshot.tensor_names
    gone = sorted(names - current.keys())
    if 2 * len(gone) > len(names):
        raise InspectorError(
            f"retie: the snapshot was taken of another model: {len(gone)} of the {len(names)} "
            f"tensors it names are not in this model (first: {', '.join(gone[:2])}); nothing was "
            "changed. Take the snapshot of this model with snapshot_ties(model) before "
            "converting it"
        )


def _check_retie(g: AliasGroup, layouts: tuple[TensorLayout, ...], o: GroupOutcome,
                 current: dict[str, torch.Tensor]) -> None:
    """Raise when group ``g`` cannot be re-tied: a name is gone, or shapes/dtypes changed."""
    if o.missing:
        raise InspectorError(f"cannot re-tie {', '.join(g.names)}: {', '.join(o.missing)} no "
                             "longer exist in the model; nothing was changed")
    first = str(current[g.names[0]].dtype).removeprefix("torch.")
    for lay in layouts:
        t = current[lay.name]
        dtype = str(t.dtype).removeprefix("torch.")
        if tuple(t.shape) != lay.shape:
            raise InspectorError(f"cannot re-tie {lay.name}: its shape is {tuple(t.shape)} but it "
                                 f"was {lay.shape} when tied; nothing was changed")
        if dtype != first:
            raise InspectorError(
                f"cannot re-tie {lay.name} ({dtype}) to {g.names[0]} ({first}): dtypes differ; "
                "convert both to one dtype first; nothing was changed")
    if g.kind != "same-object":
        _check_views_fit(g, layouts, current[g.names[0]])


def _retie_group(model: nn.Module, g: AliasGroup, layouts: tuple[TensorLayout, ...], o: GroupOutcome,
                 current: dict[str, torch.Tensor]) -> Finding:
    """Give every name of ``g`` the object or a view of the memory of ``g.names[0]``, in place."""
    keep = current[g.names[0]]
    objs: dict[int, torch.Tensor] = {0: keep}
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
    return Finding("tie-restored", "info", g.names[0],
                   f"re-tied {', '.join(g.names)} ({g.kind}, was {o.outcome}) to the memory of {g.names[0]}")


def _check_views_fit(g: AliasGroup, layouts: tuple[TensorLayout, ...], keep: torch.Tensor) -> None:
    if keep.is_meta:
        raise InspectorError(f"cannot re-tie {', '.join(g.names)} ({g.kind}) on the meta device: "
                             "there is no memory to share; materialise the model first")
    n = keep.untyped_storage().nbytes() // keep.element_size()
    for lay in layouts:
        offset = keep.storage_offset() + lay.storage_offset - layouts[0].storage_offset
        extent = 1 + sum((s - 1) * st for s, st in zip(lay.shape, lay.stride, strict=True))
        if offset < 0 or offset + extent > n:
            raise InspectorError(f"cannot re-tie {lay.name} as a view of {g.names[0]}: it would reach "
                                 "outside that tensor's storage; nothing was changed")
