"""The planner's view of a model: every tensor name, module and bytes by module prefix."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import torch
from torch import nn

from ..findings import InspectorError
from ..inventory import TensorEntry, TensorInventory, tensor_inventory
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
    """Every tensor name and module of a model, with bytes by module prefix (one pass).

    ``tensors`` and ``by_name`` (a :class:`TensorInfo` per name) are made on first ask: the
    planner itself reads only the tables below.
    """

    sizes: dict[str, int]             # module or tensor name -> bytes of unique tensors under it
    param_sizes: dict[str, int]       # module or tensor name -> bytes of unique parameters under it
    children: dict[str, list[str]]    # module -> child module names (full)
    direct: dict[str, list[str]]      # module -> its own tensor names (parameters, then buffers)
    classes: dict[str, str]           # module -> class name
    order: dict[str, int]             # every module and tensor name -> position in module order
    parent: dict[str, str]            # module -> its parent module ("" for the root's children)
    ties: tuple[tuple[str, ...], ...]  # names of one object, leader first (two or more)
    param_owners: frozenset[str]       # modules with at least one parameter name under them
    source: TensorInventory = field(repr=False, compare=False)  # the walk these tables come from
    dtype_size: int | None = None     # bytes per element floating tensors are sized at (None: their own)

    def has_params(self, module: str) -> bool:
        return module in self.param_owners

    def kind_of(self, name: str) -> str | None:
        """``"parameter"``, ``"buffer"``, or None for a name that is no tensor (a module)."""
        e = self.source.by_name.get(name)
        return None if e is None else e.kind

    @cached_property
    def tensors(self) -> tuple[TensorInfo, ...]:
        """Every tensor name, in module order (a module's parameters, then its buffers)."""
        entries = self.source.by_name
        modules = dict(zip(self.source.modules, self.source.module_objects, strict=True))
        out = []
        for m, names in self.direct.items():
            for n in names:
                e = entries[n]
                out.append(TensorInfo(n, e.kind, m, _byte_size(e.tensor, self.dtype_size), e.first_name,
                                      e.kind == "parameter" or e.attr not in modules[m]._non_persistent_buffers_set))
        return tuple(out)

    @cached_property
    def by_name(self) -> dict[str, TensorInfo]:
        """Tensor name -> its :class:`TensorInfo`."""
        return {t.name: t for t in self.tensors}


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

    children: dict[str, list[str]] = field(default_factory=dict)
    direct: dict[str, list[str]] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)
    parent: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    psizes: dict[str, int] = field(default_factory=dict)
    has_param: dict[str, bool] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)  # first name -> every name

    def modules(self, inv: TensorInventory, dtype_size: int | None) -> None:
        """Record every module in pre-order (a parent before its children), each one's own
        tensors right after it."""
        classes, order, children, parent, direct = self.classes, self.order, self.children, self.parent, \
            self.direct
        sizes, psizes, has_param = self.sizes, self.psizes, self.has_param
        own = inv.own_entries
        for mname, mod in zip(inv.modules, inv.module_objects, strict=True):
            classes[mname] = type(mod).__name__
            order[mname] = len(order)
            children[mname] = []
            if mname:
                up = parent[mname] = mname.rpartition(".")[0]
                children[up].append(mname)
            entries = own.get(mname)
            if entries is None:
                direct[mname] = []
                sizes[mname] = psizes[mname] = 0
                has_param[mname] = False
            else:
                self.own_tensors(mname, entries, dtype_size)

    def own_tensors(self, mname: str, own: Iterable[TensorEntry], dtype_size: int | None) -> None:
        """Record a module's own parameters, then buffers (its entries), and its own totals."""
        names = self.direct[mname] = []
        order, sizes, psizes = self.order, self.sizes, self.psizes
        total = ptotal = 0
        owns_param = False
        for full, kind, _, _, t, leader, _, _ in own:  # a TensorEntry, unpacked
            is_param = kind == "parameter"
            names.append(full)
            order[full] = len(order)
            nbytes = t.numel() * t.element_size() if dtype_size is None else _byte_size(t, dtype_size)
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


def inventory(model: nn.Module, dtype: torch.dtype | str | None = None,
              tensors: TensorInventory | None = None) -> Inventory:
    """Every parameter and buffer name (aliases too) and bytes by prefix, in one pass.

    Bytes count each tensor object once, under its first name (as ``named_parameters()``
    and accelerate's ``compute_module_sizes`` do). With ``dtype``, floating tensors are sized
    as if cast to it (never larger than they are); integer and bool tensors keep their size.
    Module sizes are summed bottom-up over the modules, not per tensor and prefix.

    Args:
        model: any module, also on the meta device; it is not changed.
        dtype: size floating tensors as if cast to this dtype.
        tensors: the model's :func:`~inspector.inventory.tensor_inventory`, if the caller has
            one (walked here otherwise); the result keeps it as ``source``.

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))  # 24 + 16 bytes; buffers 16 + 8
    >>> inventory(m).sizes[""], inventory(m).sizes["1"], inventory(m).param_sizes[""]
    (64, 40, 40)
    """
    dtype_size = _dtype_size(dtype)
    inv = tensor_inventory(model) if tensors is None else tensors
    tb = _Tables()
    # Modules in pre-order over every path (named_modules(remove_duplicate=False)); a tensor's
    # leader is the name named_parameters() keeps.
    tb.modules(inv, dtype_size)
    _sum_up(list(tb.classes), tb.parent, tb.sizes, tb.psizes, tb.has_param)
    return Inventory(tb.sizes, tb.psizes, tb.children, tb.direct, tb.classes, tb.order, tb.parent,
                     tuple(tuple(g) for g in tb.groups.values()), frozenset(m for m, v in tb.has_param.items() if v),
                     inv, dtype_size)


def lookup(device_map: Mapping[str, Device], name: str) -> tuple[str | None, Device | None]:
    """The map key covering ``name`` (the longest prefix) and its device."""
    probe = name
    while True:
        if probe in device_map:
            return probe, device_map[probe]
        if not probe:
            return None, None
        probe = parent_name(probe)
