"""Every name of a model's tensors, grouped by object, by storage and by module: :class:`TensorInventory`,
and :class:`ModuleTables`, every module of an inventory with its children, its own tensor names and
bytes by prefix."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import nn

from ..utils.findings import InspectorError
from .entry import TensorEntry
from .keys import StorageKeys


@dataclass(frozen=True)
class TensorInventory:
    """Every parameter and buffer name of a model, grouped by object and by storage.

    Attributes:
        entries: one per name, ``named_parameters(remove_duplicate=False)`` then
            ``named_buffers(remove_duplicate=False)`` order.
        unique: index into ``entries`` of each distinct tensor object's first name, in
            first-seen order (parameters as ``parameters()`` yields them, then buffers).
        aliased: object number -> indices into ``entries`` of every name of that object, for
            the objects held under two or more names (same-object ties).
        include_buffers: whether buffers were walked.
        modules: every module name, ``named_modules(remove_duplicate=False)`` order (``""`` is
            the root; a module held twice is listed under both names).
        module_objects: the module under each name of ``modules`` (same order).
        spans: ``(module name, start, end)``: ``entries[start:end]`` are that module's own
            parameters (or its own buffers), where the walk knew them (None: see ``own_entries``).
        storage_keys: the objects' storage keys, read on first ask (:class:`StorageKeys`).

    >>> from torch import nn
    >>> from inspector.inventory import tensor_inventory
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> inv = tensor_inventory(m)
    >>> [(e.name, e.first_name, e.module, e.nbytes) for e in inv.entries]
    [('0.weight', '0.weight', '0', 16), ('1.weight', '0.weight', '1', 16)]
    >>> len(inv.unique), inv.unique_bytes(), inv.module_bytes()[""]
    (1, 16, 16)
    """

    entries: tuple[TensorEntry, ...]
    unique: tuple[int, ...]
    aliased: dict[int, tuple[int, ...]] = field(repr=False)
    include_buffers: bool = True
    modules: tuple[str, ...] = field(default=(), repr=False)
    module_objects: tuple[nn.Module, ...] = field(default=(), repr=False, compare=False)
    storage_keys: StorageKeys = field(default_factory=StorageKeys, repr=False, compare=False)
    spans: tuple[tuple[str, int, int], ...] | None = field(default=None, repr=False, compare=False)

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self) -> Iterator[TensorEntry]:
        return iter(self.entries)

    def parameters(self) -> list[TensorEntry]:
        """Every parameter name, in walk order."""
        return [e for e in self.entries if e.kind == "parameter"]

    def buffers(self) -> list[TensorEntry]:
        """Every buffer name, in walk order."""
        return [e for e in self.entries if e.kind == "buffer"]

    def unique_entries(self, kind: str | None = None) -> list[TensorEntry]:
        """The first name of each distinct object (optionally of one ``kind``), first-seen order."""
        out = [self.entries[i] for i in self.unique]
        return out if kind is None else [e for e in out if e.kind == kind]

    def named_unique(
        self, kind: str = "parameter"
    ) -> tuple[list[tuple[str, torch.Tensor]], dict[int, list[str]]]:
        """What ``named_parameters()`` (``named_buffers()`` for ``kind="buffer"``) yields, and the
        names of the objects held under more than one name of that kind.

        Returns:
            ``[(first name, tensor)]`` in ``parameters()`` (``buffers()``) order, and
            ``{id(tensor): every name of that kind, first name first}`` for the objects with two
            or more such names (an object left out has only its first name).
        """
        entries = self.entries
        if not self.aliased:  # every name is its own object
            return [(e.name, e.tensor) for e in entries if e.kind == kind], {}
        first: list[tuple[str, torch.Tensor]] = []
        seen: dict[int, list[str]] = {}
        shared: dict[int, list[str]] = {}
        for e in entries:
            if e.kind != kind:
                continue
            names = seen.get(e.obj)
            if names is None:
                seen[e.obj] = [e.name]
                first.append((e.name, e.tensor))
            else:
                names.append(e.name)
                shared[id(e.tensor)] = names
        return first, shared

    def names_of(self, t: torch.Tensor) -> list[str]:
        """Every name of tensor object ``t`` (empty if the model does not hold it)."""
        return [self.entries[i].name for i in self.by_object.get(id(t), ())]

    def entries_of(self, obj: int) -> tuple[int, ...]:
        """Indices into ``entries`` of every name of object number ``obj``."""
        return self.aliased.get(obj) or (self.unique[obj],)

    @cached_property
    def by_object(self) -> dict[int, tuple[int, ...]]:
        """``id(tensor)`` -> indices into ``entries`` of every name of that object, first-seen order."""
        return {id(self.entries[i].tensor): self.entries_of(o) for o, i in enumerate(self.unique)}

    @cached_property
    def by_storage(self) -> dict[tuple, tuple[int, ...]]:
        """Storage key -> object numbers (indices into ``unique``) of the objects over that
        storage, first-seen order; objects without a key are left out. Made on first ask."""
        out: dict[tuple, list[int]] = {}
        for obj, key in enumerate(self.storage_keys.all()):
            if key is not None:
                out.setdefault(key, []).append(obj)
        return {k: tuple(v) for k, v in out.items()}

    @cached_property
    def own_entries(self) -> dict[str, list[TensorEntry]]:
        """Module name -> the entries that module holds itself (parameters, then buffers), walk
        order; modules that hold none are absent. Made on first ask."""
        out: dict[str, list[TensorEntry]] = {}
        entries = self.entries
        if self.spans is not None:
            for module, start, end in self.spans:
                own = out.get(module)
                if own is None:
                    out[module] = list(entries[start:end])
                else:
                    own += entries[start:end]
            return out
        for e in entries:
            own = out.get(e.module)
            if own is None:
                out[e.module] = [e]
            else:
                own.append(e)
        return out

    @cached_property
    def by_name(self) -> dict[str, TensorEntry]:
        """Name -> entry (the first entry for a name listed twice)."""
        out: dict[str, TensorEntry] = {}
        for e in self.entries:
            out.setdefault(e.name, e)
        return out

    def module_tables(self, dtype: torch.dtype | str | None = None) -> ModuleTables:
        """Every module and tensor name with its children, own tensors and bytes by prefix
        (:class:`ModuleTables`), floating tensors sized as if cast to ``dtype``."""
        return module_tables(self, dtype)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Name -> tensor, for every name."""
        return {name: e.tensor for name, e in self.by_name.items()}

    def unique_numel(self, kind: str = "parameter") -> int:
        """Elements of the distinct objects of ``kind`` (what ``parameters()`` counts)."""
        return sum(e.numel for e in self.unique_entries(kind))

    def numel_with_aliases(self, kind: str = "parameter") -> int:
        """Elements counting every name of ``kind``."""
        return sum(e.numel for e in self.entries if e.kind == kind)

    def unique_bytes(self) -> int:
        """Bytes of every distinct object (parameters and walked buffers), each counted once."""
        return sum(e.nbytes for e in self.unique_entries())

    def module_bytes(self, local: bool = False) -> dict[str, int]:
        """Module name -> bytes of the distinct tensors below it, each counted at its first name.

        One pass that adds each tensor's bytes to every parent prefix of its first holder
        (``""`` is the whole model). Modules that hold no tensor below them are absent.

        Args:
            local: count this rank's bytes of DTensors instead of the global bytes.
        """
        sizes: dict[str, int] = {}
        for e in self.unique_entries():
            n = e.local_nbytes if local else e.nbytes
            sizes[""] = sizes.get("", 0) + n
            if not e.module:
                continue
            parts = e.module.split(".")
            for k in range(1, len(parts) + 1):
                prefix = ".".join(parts[:k])
                sizes[prefix] = sizes.get(prefix, 0) + n
        return sizes

    def storage_groups(self) -> list[list[TensorEntry]]:
        """First entries of the objects over each storage that holds two or more objects."""
        return [[self.entries[self.unique[o]] for o in objs]
                for objs in self.by_storage.values() if len(objs) > 1]

    def has_meta(self) -> bool:
        """Whether any tensor is on the meta device."""
        return any(e.device.type == "meta" for e in self.unique_entries())


@dataclass(frozen=True)
class ModuleTables:
    """The modules of one :class:`TensorInventory` as tables keyed by name (one pass).

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
