"""One walk over a model's parameters and buffers, with every name, owner and storage.

Every analysis that groups tensors by identity or by memory starts here:
``named_parameters(remove_duplicate=False)`` then ``named_buffers(remove_duplicate=False)``,
one entry per name, each holding its tensor (so ``id()``s are not reused while the
inventory lives), the name ``named_parameters()`` keeps for that object, and the key of
the storage under it. DTensors (FSDP2, tensor parallelism) carry their global shape and
this rank's local shape and bytes; ``torch.distributed.tensor`` is never imported here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple, cast

import torch
from torch import nn

from .checks import require_module

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor

KINDS = ("parameter", "buffer")


def storage_key(t: torch.Tensor) -> tuple[str, int | None, int] | None:
    """``(device type, device index, address of the storage)``: equal keys mean one storage.

    None where there is no memory to compare: meta and fake tensors, tensors with no
    elements, sparse and quantized tensors, wrapper subclasses without storage (a DTensor
    itself; its ``to_local()`` has one).

    >>> w = torch.zeros(2, 3)
    >>> storage_key(w[1]) == storage_key(w), storage_key(torch.zeros(2, device="meta"))
    (True, None)
    """
    if t.is_meta or t.numel() == 0:
        return None
    try:
        storage = t.untyped_storage()  # sparse tensors and wrapper subclasses have none: they raise
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    device = storage.device
    # meta and fake tensors have their storage on meta (reading a fake one's address warns)
    if device.type == "meta" or t.is_quantized or t.layout is not torch.strided:
        return None
    ptr = storage.data_ptr()
    return None if ptr == 0 else (device.type, device.index, ptr)


def _dtensor_type() -> type | None:
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


class TensorEntry(NamedTuple):
    """One name of one tensor, as the walk met it (an immutable record).

    The walk records who holds the tensor, the name that object was first met under and its
    storage key; everything else is read from the tensor when asked, so a walk over a model
    with a million names stays as fast as ``named_parameters()`` itself.

    Attributes:
        name: full dotted name (``"h.0.attn.c_attn.weight"``).
        kind: ``"parameter"`` or ``"buffer"``.
        module: name of the module that holds it under ``attr`` (``""`` for the root).
        attr: the key in that module's ``_parameters`` or ``_buffers``.
        tensor: the tensor itself (kept alive while the inventory lives).
        first_name: the first name of the same object: what ``named_parameters()`` (or
            ``named_buffers()``) keeps; equal to ``name`` for the first holder.
        obj: number of the object: index into :attr:`TensorInventory.unique`.
        storage_key: :func:`storage_key` of the tensor at walk time, or None (always for a DTensor).
    """

    name: str
    kind: str
    module: str
    attr: str
    tensor: torch.Tensor
    first_name: str
    obj: int
    storage_key: tuple | None

    @property
    def is_alias(self) -> bool:
        """Whether an earlier name holds the same object."""
        return self.name != self.first_name

    @property
    def shape(self) -> tuple[int, ...]:
        """Global shape."""
        return tuple(self.tensor.shape)

    @property
    def numel(self) -> int:
        """Elements (global for a DTensor)."""
        return self.tensor.numel()

    @property
    def nbytes(self) -> int:
        """``numel * element_size`` (global for a DTensor)."""
        return self.tensor.numel() * self.tensor.element_size()

    @property
    def dtype(self) -> torch.dtype:
        return self.tensor.dtype

    @property
    def dtype_name(self) -> str:
        """``"float32"``, ``"bfloat16"``..."""
        return str(self.tensor.dtype).removeprefix("torch.")

    @property
    def device(self) -> torch.device:
        return self.tensor.device

    @property
    def requires_grad(self) -> bool:
        return self.tensor.requires_grad

    @property
    def storage_offset(self) -> int:
        """In elements; 0 where the tensor has no strided storage (sparse, quantized, DTensor)."""
        t = self.tensor
        if t.layout != torch.strided or t.is_quantized or self.is_dtensor:
            return 0
        return int(t.storage_offset())

    @property
    def is_dtensor(self) -> bool:
        cls = _dtensor_type()
        return cls is not None and isinstance(self.tensor, cls)

    @property
    def local_shape(self) -> tuple[int, ...]:
        """Shape of this rank's piece (``shape`` for a plain tensor)."""
        t = cast("DTensor", self.tensor).to_local() if self.is_dtensor else self.tensor
        return tuple(t.shape)

    @property
    def local_nbytes(self) -> int:
        """Bytes of this rank's piece (``nbytes`` for a plain tensor)."""
        t = cast("DTensor", self.tensor).to_local() if self.is_dtensor else self.tensor
        return t.numel() * t.element_size()

    @property
    def placements(self) -> str:
        """DTensor placements as text (``"Shard(0)"``), ``""`` for a plain tensor."""
        if not self.is_dtensor:
            return ""
        from .distributed.tensors import placements_text

        return placements_text(self.tensor)

    @property
    def mesh(self) -> tuple[int, ...]:
        """Shape of the DTensor's device mesh, ``()`` for a plain tensor."""
        return tuple(cast("DTensor", self.tensor).device_mesh.shape) if self.is_dtensor else ()


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
        by_storage: storage key -> indices into ``unique`` (object numbers) of the objects
            over that storage, first-seen order; objects without a key are left out.
        include_buffers: whether buffers were walked.
        modules: every module name, ``named_modules(remove_duplicate=False)`` order (``""`` is
            the root; a module held twice is listed under both names).

    >>> from torch import nn
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
    by_storage: dict[tuple, tuple[int, ...]] = field(repr=False)
    include_buffers: bool = True
    modules: tuple[str, ...] = field(default=(), repr=False)

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
    def by_name(self) -> dict[str, TensorEntry]:
        """Name -> entry (the first entry for a name listed twice)."""
        out: dict[str, TensorEntry] = {}
        for e in self.entries:
            out.setdefault(e.name, e)
        return out

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


class _Builder:
    """Entries and groupings, filled one name at a time in walk order."""

    def __init__(self) -> None:
        self.dtensor = _dtensor_type()
        self.entries: list[TensorEntry] = []
        self.unique: list[int] = []
        self.first: dict[int, int] = {}  # id(tensor) -> index of its first entry
        self.aliased: dict[int, list[int]] = {}
        self.by_storage: dict[tuple, list[int]] = {}
        self.modules: list[str] = []

    def add(self, name: str, kind: str, module: str, attr: str, t: torch.Tensor) -> None:
        entries = self.entries
        i = len(entries)
        j = self.first.get(id(t))
        if j is None:
            obj = len(self.unique)
            self.first[id(t)] = i
            self.unique.append(i)
            dtensor = self.dtensor
            key = None if dtensor is not None and isinstance(t, dtensor) else storage_key(t)
            # tuple.__new__: TensorEntry(...) without its keyword handling, for the hot loop
            entries.append(tuple.__new__(TensorEntry, (name, kind, module, attr, t, name, obj, key)))
            if key is not None:
                self.by_storage.setdefault(key, []).append(obj)
        else:
            f = entries[j]
            self.aliased.setdefault(f.obj, [j]).append(i)
            entries.append(tuple.__new__(TensorEntry, (name, kind, module, attr, t, f.name, f.obj,
                                                       f.storage_key)))

    def walk(self, model: nn.Module, include_buffers: bool) -> None:
        """``named_parameters`` then ``named_buffers``, with duplicates, and every module name.

        Where no module overrides ``named_modules`` and the root overrides neither
        ``named_parameters`` nor ``named_buffers``, one pre-order walk over ``_modules`` with a
        stack visits what ``named_modules(remove_duplicate=False)`` yields, in its order, without
        its chain of generators (one per level of depth); otherwise the three methods are asked.
        """
        cls = type(model)
        if cls.named_parameters is nn.Module.named_parameters and cls.named_buffers is nn.Module.named_buffers:
            buffers = self._stack_walk(model, include_buffers)
            if buffers is not None:
                for b in buffers:
                    self.add(*b)
                return
            self.__init__()  # type: ignore[misc]
        self.modules.extend(n for n, _ in model.named_modules(remove_duplicate=False))
        for n, t in model.named_parameters(remove_duplicate=False):
            self.add(n, "parameter", *_split(n), t)
        if include_buffers:
            for n, buf in model.named_buffers(remove_duplicate=False):
                self.add(n, "buffer", *_split(n), buf)

    def _stack_walk(self, model: nn.Module,
                    include_buffers: bool) -> list[tuple[str, str, str, str, torch.Tensor]] | None:
        """Add every parameter; return the buffers to add after them (None: some module overrides
        ``named_modules``, start again with the methods)."""
        buffers: list[tuple[str, str, str, str, torch.Tensor]] = []
        plain = nn.Module.named_modules
        add, modules = self.add, self.modules
        stack: list[tuple[str, nn.Module]] = [("", model)]
        while stack:
            prefix, module = stack.pop()
            if type(module).named_modules is not plain:
                return None
            modules.append(prefix)
            dot = prefix + "." if prefix else ""
            for k, v in module._parameters.items():
                if v is not None:
                    add(dot + k, "parameter", prefix, k, v)
            if include_buffers:
                for k, b in module._buffers.items():
                    if b is not None:
                        buffers.append((dot + k, "buffer", prefix, k, b))
            for k, m in reversed(module._modules.items()):
                if m is not None:
                    stack.append((dot + k, m))
        return buffers


def _split(name: str) -> tuple[str, str]:
    module, _, attr = name.rpartition(".")
    return module, attr


def tensor_inventory(model: nn.Module, include_buffers: bool = True, *,
                     what: str = "tensor_inventory") -> TensorInventory:
    """Walk ``model``'s parameters and buffers once, keeping every name and grouping by object and storage.

    Metadata only: works on the meta device and allocates nothing. The model is not changed.

    Args:
        model: any ``nn.Module``.
        include_buffers: also walk ``named_buffers(remove_duplicate=False)``.
        what: the function to name when ``model`` is no ``nn.Module`` (the one the user called).

    Returns:
        The :class:`TensorInventory`; build it once per analysis and pass it on.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> inv = tensor_inventory(m)
    >>> [e.is_alias for e in inv], inv.unique_numel(), inv.numel_with_aliases()
    ([False, True], 4, 8)
    """
    model = require_module(model, what)
    b = _Builder()
    b.walk(model, include_buffers)
    return TensorInventory(tuple(b.entries), tuple(b.unique), {k: tuple(v) for k, v in b.aliased.items()},
                           {k: tuple(v) for k, v in b.by_storage.items()}, include_buffers, tuple(b.modules))
