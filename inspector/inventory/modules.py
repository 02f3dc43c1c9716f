"""Every module of an inventory with its children, its own tensor names and bytes by prefix."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..utils.findings import InspectorError
from .entry import TensorEntry

if TYPE_CHECKING:
    from .tables import TensorInventory


@dataclass(frozen=True)
class ModuleTables:
    """The modules of one :class:`~.tables.TensorInventory` as tables keyed by name (one pass).

    What the device-map planner reads: bytes under each module and tensor name, and the tree.
    """

    sizes: dict[str, int]             # module or tensor name -> bytes of unique tensors under it
    param_sizes: dict[str, int]       # module or tensor name -> bytes of unique parameters under it
    children: dict[str, list[str]]    # module -> child module names (full)
    direct: dict[str, list[str]]      # module -> its own tensor names (parameters, then buffers)
    classes: dict[str, str]           # module -> class name
    order: dict[str, int]             # every module and tensor name -> position in module order
    parent: dict[str, str]            # module -> its parent module ("" for the root's children)
    ties: tuple[tuple[str, ...], ...]  # names of one object, first name first (two or more)
    param_owners: frozenset[str]       # modules with at least one parameter name under them
    inventory: TensorInventory = field(repr=False, compare=False)  # the walk these tables come from
    dtype_size: int | None = None     # bytes per element floating tensors are sized at (None: their own)

    def has_params(self, module: str) -> bool:
        return module in self.param_owners

    def kind_of(self, name: str) -> str | None:
        """``"parameter"``, ``"buffer"``, or None for a name that is no tensor (a module)."""
        e = self.inventory.by_name.get(name)
        return None if e is None else e.kind


def dtype_size(dtype: torch.dtype | str | None) -> int | None:
    """Bytes per element of ``dtype`` (a dtype or its name), or None."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise InspectorError("unknown dtype for sizing; use e.g. float16, bfloat16 or float32")
    return None if dtype is None else torch.empty((), dtype=dtype, device="meta").element_size()


def _byte_size(t: torch.Tensor, size_at: int | None) -> int:
    size = t.element_size()
    if size_at is not None and (t.is_floating_point() or t.is_complex()):
        size = min(size, size_at)
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


@dataclass
class _Tables:
    """What the pass fills in: the fields of :class:`ModuleTables` while they are built."""

    children: dict[str, list[str]] = field(default_factory=dict)
    direct: dict[str, list[str]] = field(default_factory=dict)
    classes: dict[str, str] = field(default_factory=dict)
    order: dict[str, int] = field(default_factory=dict)
    parent: dict[str, str] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)
    psizes: dict[str, int] = field(default_factory=dict)
    has_param: dict[str, bool] = field(default_factory=dict)
    groups: dict[str, list[str]] = field(default_factory=dict)  # first name -> every name

    def modules(self, inv: TensorInventory, size_at: int | None) -> None:
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
                self.own_tensors(mname, entries, size_at)

    def own_tensors(self, mname: str, own: Iterable[TensorEntry], size_at: int | None) -> None:
        """Record a module's own parameters, then buffers (its entries), and its own totals."""
        names = self.direct[mname] = []
        order, sizes, psizes = self.order, self.sizes, self.psizes
        total = ptotal = 0
        owns_param = False
        for full, kind, _, _, t, leader, _, _ in own:  # a TensorEntry, unpacked
            is_param = kind == "parameter"
            names.append(full)
            order[full] = len(order)
            nbytes = t.numel() * t.element_size() if size_at is None else _byte_size(t, size_at)
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


def module_tables(inv: TensorInventory, dtype: torch.dtype | str | None = None) -> ModuleTables:
    """Every module and tensor name of ``inv`` with bytes by prefix, in one pass over its modules.

    Bytes count each tensor object once, under its first name (as ``named_parameters()``
    and accelerate's ``compute_module_sizes`` do). With ``dtype``, floating tensors are sized
    as if cast to it (never larger than they are); integer and bool tensors keep their size.
    Module sizes are summed bottom-up over the modules, not per tensor and prefix.
    """
    size_at = dtype_size(dtype)
    tb = _Tables()
    # Modules in pre-order over every path (named_modules(remove_duplicate=False)); a tensor's
    # first name is the one named_parameters() keeps.
    tb.modules(inv, size_at)
    _sum_up(list(tb.classes), tb.parent, tb.sizes, tb.psizes, tb.has_param)
    return ModuleTables(tb.sizes, tb.psizes, tb.children, tb.direct, tb.classes, tb.order, tb.parent,
                        tuple(tuple(g) for g in tb.groups.values()),
                        frozenset(m for m, v in tb.has_param.items() if v), inv, size_at)
