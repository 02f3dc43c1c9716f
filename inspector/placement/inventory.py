"""The planner's view of a model: every tensor name, module and bytes by module prefix."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn

from ..findings import InspectorError
from .budget import Device


class TensorInfo(NamedTuple):
    """One name of a parameter or buffer; ``leader`` is the first name of the same object."""

    name: str
    kind: str          # "parameter" | "buffer"
    module: str
    nbytes: int
    leader: str
    persistent: bool = True


@dataclass(frozen=True)
class Inventory:
    """Every tensor name and module of a model, with bytes by module prefix (one pass)."""

    tensors: tuple[TensorInfo, ...]
    by_name: dict[str, TensorInfo]
    sizes: dict[str, int]             # module or tensor name -> bytes of unique tensors under it
    param_sizes: dict[str, int]       # module or tensor name -> bytes of unique parameters under it
    children: dict[str, list[str]]    # module -> child module names (full)
    direct: dict[str, list[str]]      # module -> its own tensor names (parameters, then buffers)
    classes: dict[str, str]           # module -> class name
    order: dict[str, int]             # every module and tensor name -> position in module order
    parent: dict[str, str]            # module -> its parent module ("" for the root's children)
    ties: tuple[tuple[str, ...], ...]  # names of one object, leader first (two or more)
    param_owners: frozenset[str]       # modules with at least one parameter name under them

    def has_params(self, module: str) -> bool:
        return module in self.param_owners


def prefixes(module: str) -> list[str]:
    """'a.b' -> ['', 'a', 'a.b']."""
    if not module:
        return [""]
    parts = module.split(".")
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def parent_name(name: str) -> str:
    return name.rpartition(".")[0]


def _byte_size(t: torch.Tensor, dtype_size: int | None) -> int:
    size = t.element_size()
    if dtype_size is not None and (t.is_floating_point() or t.is_complex()):
        size = min(size, dtype_size)
    return t.numel() * size


def _sum_up(modules: list[str], parent: dict[str, str], sizes: dict[str, int], psizes: dict[str, int],
            has_param: dict[str, bool]) -> None:
    """Add each module's totals into its parent, deepest first (``modules`` is in pre-order)."""
    for mname in reversed(modules):
        if mname:
            up = parent[mname]
            sizes[up] += sizes[mname]
            psizes[up] += psizes[mname]
            has_param[up] |= has_param[mname]


def _dtype_size(dtype: torch.dtype | str | None) -> int | None:
    """Bytes per element of ``dtype`` (a dtype or its name), or None."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise InspectorError("unknown dtype for sizing; use e.g. float16, bfloat16 or float32")
    return None if dtype is None else torch.empty((), dtype=dtype, device="meta").element_size()


@dataclass
class _Tables:
    """What the walk fills in: the fields of :class:`Inventory` while they are built."""

    tensors: list[TensorInfo] = field(default_factory=list)
    children: dict[str, list[str]] = field(default_factory=dict)
    direct: dict[str, list[str]] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)
    parent: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    psizes: dict[str, int] = field(default_factory=dict)
    has_param: dict[str, bool] = field(default_factory=dict)
    first: dict[int, str] = field(default_factory=dict)      # id(tensor) -> its first name
    groups: dict[str, list[str]] = field(default_factory=dict)  # first name -> every name

    def module(self, mname: str, mod: nn.Module) -> list[tuple[str, nn.Module]]:
        """Record a module; return its children (full name, module) in order."""
        self.classes[mname] = type(mod).__name__
        self.order[mname] = len(self.order)
        prefix = f"{mname}." if mname else ""
        names = self.children[mname] = []
        kids = []
        parent = self.parent
        for c, sub in mod._modules.items():
            if sub is not None:
                full = prefix + c
                names.append(full)
                kids.append((full, sub))
                parent[full] = mname
        return kids

    def own_tensors(self, mname: str, mod: nn.Module, dtype_size: int | None) -> None:
        """Record a module's own parameters, then buffers, and its own totals."""
        prefix = f"{mname}." if mname else ""
        own = self.direct[mname] = []
        order, first, sizes, psizes, tensors = self.order, self.first, self.sizes, self.psizes, self.tensors
        total = ptotal = 0
        owns_param = False
        for kind, store in (("parameter", mod._parameters), ("buffer", mod._buffers)):
            is_param = kind == "parameter"
            for local, t in store.items():
                if t is None:
                    continue
                full = prefix + local
                own.append(full)
                order[full] = len(order)
                leader = first.setdefault(id(t), full)
                nbytes = _byte_size(t, dtype_size)
                tensors.append(TensorInfo(full, kind, mname, nbytes, leader,
                                          is_param or local not in mod._non_persistent_buffers_set))
                if leader == full:
                    sizes[full] = nbytes
                    psizes[full] = nbytes if is_param else 0
                    total += nbytes
                    ptotal += nbytes if is_param else 0
                else:
                    sizes[full] = psizes[full] = 0
                    self.groups.setdefault(leader, [leader]).append(full)
                owns_param |= is_param
        sizes[mname], psizes[mname], self.has_param[mname] = total, ptotal, owns_param


def inventory(model: nn.Module, dtype: torch.dtype | str | None = None) -> Inventory:
    """Every parameter and buffer name (aliases too) and bytes by prefix, in one pass.

    Bytes count each tensor object once, under its first name (as ``named_parameters()``
    and accelerate's ``compute_module_sizes`` do). With ``dtype``, floating tensors are sized
    as if cast to it (never larger than they are); integer and bool tensors keep their size.
    Module sizes are summed bottom-up over the modules, not per tensor and prefix.

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))  # 24 + 16 bytes; buffers 16 + 8
    >>> inventory(m).sizes[""], inventory(m).sizes["1"], inventory(m).param_sizes[""]
    (64, 40, 40)
    """
    dtype_size = _dtype_size(dtype)
    tb = _Tables()
    # Pre-order over every path (like named_modules(remove_duplicate=False)); a tensor's leader is
    # its first name in this order, which is the name named_parameters()/named_buffers() keep.
    # The model holds every tensor for the whole pass, so ids are not reused while grouping.
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        mname, mod = stack.pop()
        stack.extend(reversed(tb.module(mname, mod)))
        tb.own_tensors(mname, mod, dtype_size)
    _sum_up(list(tb.classes), tb.parent, tb.sizes, tb.psizes, tb.has_param)
    return Inventory(tuple(tb.tensors), {t.name: t for t in tb.tensors}, tb.sizes, tb.psizes, tb.children,
                     tb.direct, tb.classes, tb.order, tb.parent, tuple(tuple(g) for g in tb.groups.values()),
                     frozenset(m for m, v in tb.has_param.items() if v))


def lookup(device_map: Mapping[str, Device], name: str) -> tuple[str | None, Device | None]:
    """The map key covering ``name`` (the longest prefix) and its device."""
    probe = name
    while True:
        if probe in device_map:
            return probe, device_map[probe]
        if not probe:
            return None, None
        probe = parent_name(probe)
