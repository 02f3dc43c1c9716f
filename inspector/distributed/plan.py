"""What ``check_step`` works out once per model and keeps between steps: names, placements,
replica keys, 1-D views of the local pieces and which slices of them each call reads."""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch
from torch import nn

from ..inventory import tensor_inventory
from ..utils.dtensors import holders, is_dtensor, placements_text, replica_key
from ..utils.wrappers import underlying
from . import digest

Taker = Callable[[Sequence[Any]], Sequence[Any]]
_REGISTRIES = operator.attrgetter("_modules", "_parameters", "_buffers")


def _held(modules: list[weakref.ref]) -> list[int] | None:
    """The sizes of the modules' registries, then the ids of everything they hold, in order; None when
    a module is gone. In C (``map``): 500 modules in about 0.1 ms, not 0.4 ms."""
    alive = list(map(_CALL, modules))
    if None in alive:
        return None
    registries = list(chain.from_iterable(map(_REGISTRIES, alive)))
    return list(map(len, registries)) + list(map(id, chain.from_iterable(map(dict.values, registries))))


_PTR = torch.Tensor.data_ptr
_CALL = operator.call if hasattr(operator, "call") else (lambda ref: ref())


@dataclass
class Plan:
    """What does not change between steps, for one model and world size."""

    modules: list[weakref.ref]   # weakly: a plan must not keep a model alive
    held: list[int] | None       # sizes and ids of what their registries held
    world: int
    tensors: list[tuple[str, str, torch.Tensor]]
    dtensor: list[bool]
    keys: list[int]
    holders: list[float]
    static: list[dict[str, Any]]
    resync: str
    is_param: list[bool]
    sizes: list[int]          # element sizes
    numels: list[int]         # global element counts
    columns: dict[str, torch.Tensor] = field(default_factory=dict)  # keys, holders, masks as tensors
    param_index: list[int] = field(default_factory=list)            # the parameters' positions
    param_tensors: list[torch.Tensor] = field(default_factory=list)
    dtensor_params: list[int] = field(default_factory=list)         # DTensors among them (in that list)
    strided: list[bool] = field(default_factory=list)               # local pieces with a data pointer
    flats: list[torch.Tensor | None] = field(default_factory=list)   # 1-D views of the local pieces
    pointers: list[int] = field(default_factory=list)                # their data pointers when made
    lengths: list[int] = field(default_factory=list)                 # their element counts
    local_numel: torch.Tensor = field(default_factory=lambda: torch.zeros(0))
    reads: dict[int | None, Reads] = field(default_factory=dict)  # per call % PARTS, while pointers hold
    positions: dict[tuple[str, ...], tuple[torch.Tensor, torch.Tensor, set[int]]] = field(
        default_factory=dict
    )
    pieces: list[torch.Tensor] | None = None  # the tensors themselves, when none is a DTensor
    takers: dict[tuple[str, ...], Taker | None] = field(default_factory=dict)  # by the names given

    def valid(self, world: int, resync: str) -> bool:
        """Whether the model still holds the same modules, parameters and buffers."""
        return (self.world, self.resync) == (world, resync) and _held(self.modules) == self.held

    def local_flats(self, pieces: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """1-D views of ``pieces``, remade when a piece's storage changed (``p.data = ...``)."""
        try:
            if all(self.strided) and len(pieces) == len(self.strided):
                pointers = list(map(_PTR, pieces))
            else:
                pointers = [p.data_ptr() if s else 0 for p, s in zip(pieces, self.strided, strict=True)]
        except RuntimeError:  # a piece that has become sparse
            pointers = []
        if pointers != self.pointers or not pointers:
            self.strided = [p.layout == torch.strided for p in pieces]
            pointers = [p.data_ptr() if s else 0 for p, s in zip(pieces, self.strided, strict=True)]
            self.flats = [digest.flat(p.detach()) if p.layout == torch.strided else None for p in pieces]
            self.pointers = pointers
            self.lengths = [f.numel() if f is not None else 0 for f in self.flats]
            self.local_numel = torch.tensor([p.numel() for p in pieces], dtype=torch.float64)
            self.reads = {}
        return self.flats

    def read(self, call: int) -> list[Reads]:
        """What call number ``call`` reads of the local values: the small tensors whole, and one
        window of the large ones (kept: the views stay valid while the pointers hold)."""
        c = call % digest.PARTS
        for key in (None, c):
            if key not in self.reads:
                self.reads[key] = Reads.of(self, key)
        return [self.reads[None], self.reads[c]]

    def taken(self, names: tuple[str, ...]) -> Taker | None:
        """A function that picks, from a list in the order of ``names``, the entries of the plan's
        parameters in plan order; None when ``names`` leaves one out (or holds one twice)."""
        if names not in self.takers:
            plan_index, name_index, covered = self.position(names)
            if len(covered) != len(self.param_index) or len(set(names)) != len(names):
                self.takers[names] = None
            else:  # itemgetter of one index gives the entry itself, not a tuple
                by_plan = dict(zip(plan_index.tolist(), name_index.tolist(), strict=True))
                order = [by_plan[i] for i in self.param_index]
                self.takers[names] = (operator.itemgetter(*order) if len(order) > 1 else
                                      lambda values: [values[k] for k in order])
        return self.takers[names]

    def position(self, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor, set[int]]:
        """For norms given per name: the plan's indices, the names' indices, and the plan indices covered."""
        if names not in self.positions:
            where = {name: i for i, (name, kind, _) in enumerate(self.tensors) if kind == "parameter"}
            pairs = [(where[n], k) for k, n in enumerate(names) if n in where]
            self.positions[names] = (
                torch.tensor([a for a, _ in pairs], dtype=torch.long),
                torch.tensor([b for _, b in pairs], dtype=torch.long),
                {a for a, _ in pairs},
            )
        return self.positions[names]


@dataclass
class Reads:
    """Slices of the local values that calls read (:func:`.digest.schedule`): all of them for
    NaN/Inf, those another rank must equal for the hash (made ready per device)."""

    checked: list[tuple[torch.Tensor, list[torch.Tensor]]]            # per device and dtype, for NaN/Inf
    hashed: list[tuple[torch.device, torch.Tensor, digest.Prepared, int]]
    part: int                                                          # -1: whole tensors, else call % PARTS

    @classmethod
    def of(cls, plan: Plan, call: int | None) -> Reads:
        flats = plan.flats
        spans = [
            (i, a, b) for i, a, b in digest.schedule(plan.numels, plan.lengths, call) if flats[i] is not None
        ]
        values = [flats[i][a:b] for i, a, b in spans]  # type: ignore[index]
        by_device: dict[torch.device, list[int]] = {}
        for k, (i, _, _) in enumerate(spans):
            if plan.keys[i] >= 0:
                by_device.setdefault(values[k].device, []).append(k)
        hashed = [
            (
                device,
                torch.tensor([spans[k][0] for k in ks], dtype=torch.long),
                digest.prepare([(values[k], spans[k][1]) for k in ks], keep=call is None),
                len(ks),
            )
            for device, ks in by_device.items()
        ]
        return cls(digest.float_groups([i for i, _, _ in spans], values), hashed,
                   -1 if call is None else call % digest.PARTS)


_plans: weakref.WeakKeyDictionary[nn.Module, Plan] = weakref.WeakKeyDictionary()


def _resync(model: nn.Module) -> str:
    """What the wrapper copies from rank 0 to every rank before each forward pass."""
    if type(model).__name__ == "DistributedDataParallel" and getattr(model, "broadcast_buffers", False):
        return "buffers"
    return ""


def plan_for(model: nn.Module, world: int) -> Plan:
    """The kept plan of ``model`` for a ``world``-rank group, made again when its tensors changed."""
    inner = underlying(model)  # DDP / torch.compile: the names the user wrote
    resync = _resync(model)
    cached = _plans.get(inner)
    if cached is not None and cached.valid(world, resync):
        return cached
    inv = tensor_inventory(inner)
    tensors = [(e.name, e.kind, e.tensor) for e in inv.unique_entries()]  # each once, under its first name
    modules = [weakref.ref(m) for m in dict.fromkeys(inv.module_objects)]  # what modules() yields
    static = [{
        "name": name, "kind": kind, "placements": placements_text(t),
        "mesh": list(t.device_mesh.shape) if is_dtensor(t) else [],
        "shape": list(t.shape), "numel": t.numel(), "dtype": str(t.dtype).removeprefix("torch."),
        "requires_grad": False, "resync": resync if kind == "buffer" else "",
    } for name, kind, t in tensors]
    plan = Plan(modules, _held(modules), world, tensors,
                [is_dtensor(t) for _, _, t in tensors], [replica_key(t, world) for _, _, t in tensors],
                [holders(t, world) for _, _, t in tensors], static, resync,
                [k == "parameter" for _, k, _ in tensors], [t.element_size() for _, _, t in tensors],
                [t.numel() for _, _, t in tensors])
    plan.columns = _columns(plan)
    plan.param_index = [i for i, p in enumerate(plan.is_param) if p]
    plan.param_tensors = [tensors[i][2] for i in plan.param_index]
    plan.dtensor_params = [k for k, i in enumerate(plan.param_index) if plan.dtensor[i]]
    plan.strided = [True] * len(tensors)
    plan.pieces = None if any(plan.dtensor) else [t for _, _, t in tensors]
    _plans[inner] = plan
    return plan


def _columns(plan: Plan) -> dict[str, torch.Tensor]:
    """The per-tensor facts the columnar findings and the per-rank sums read, as tensors."""
    is_param = torch.tensor(plan.is_param, dtype=torch.bool)
    return {
        "keys": torch.tensor(plan.keys, dtype=torch.float64),
        "holders": torch.tensor(plan.holders, dtype=torch.float64),
        "is_param": is_param,
        "plain_param": is_param & ~torch.tensor(plan.dtensor, dtype=torch.bool),
        "sharded": is_param
        & torch.tensor(["Shard" in s["placements"] for s in plan.static], dtype=torch.bool),
        "element_size": torch.tensor(plan.sizes, dtype=torch.float64),
        "param_index": torch.tensor([i for i, p in enumerate(plan.is_param) if p], dtype=torch.long),
    }


