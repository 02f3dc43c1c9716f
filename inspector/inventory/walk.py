"""The walk: ``named_parameters`` then ``named_buffers`` with duplicates, in one pass."""

from __future__ import annotations

import torch
from torch import nn

from ..utils.checks import require_module
from .entry import TensorEntry
from .keys import StorageKeys
from .tables import TensorInventory


class _Builder:
    """Entries and groupings, filled one name at a time in walk order."""

    def __init__(self) -> None:
        self.entries: list[TensorEntry] = []
        self.unique: list[int] = []
        self.first: dict[int, int] = {}  # id(tensor) -> index of its first entry
        self.aliased: dict[int, list[int]] = {}
        self.keys = StorageKeys()
        self.modules: list[str] = []
        self.module_objects: list[nn.Module] = []
        self.spans: list[tuple[str, int, int]] | None = None  # see TensorInventory.spans

    def add(
        self, name: str, kind: str, module: str, attr: str, t: torch.Tensor, j: int | None = None
    ) -> None:
        """Record one name; ``j`` is the index of the object's first entry where the caller knows it."""
        entries = self.entries
        i = len(entries)
        if j is None:
            j = self.first.get(id(t))
        if j is None:
            tensors = self.keys._tensors
            obj = len(tensors)
            self.first[id(t)] = i
            self.unique.append(i)
            tensors.append(t)
            # tuple.__new__: TensorEntry(...) without its keyword handling, for the hot loop
            entries.append(tuple.__new__(TensorEntry, (name, kind, module, attr, t, name, obj, self.keys)))
        else:
            f = entries[j]
            self.aliased.setdefault(f.obj, [j]).append(i)
            entries.append(
                tuple.__new__(TensorEntry, (name, kind, module, attr, t, f.name, f.obj, self.keys))
            )

    def walk(self, model: nn.Module, include_buffers: bool) -> None:
        """``named_parameters`` then ``named_buffers``, with duplicates, and every module name.

        Where no module overrides ``named_modules`` and the root overrides neither
        ``named_parameters`` nor ``named_buffers``, one pre-order walk over ``_modules`` with a
        stack visits what ``named_modules(remove_duplicate=False)`` yields, in its order, without
        its chain of generators (one per level of depth); otherwise the three methods are asked.
        """
        cls = type(model)
        if (
            cls.named_parameters is nn.Module.named_parameters
            and cls.named_buffers is nn.Module.named_buffers
        ):
            if self._stack_walk(model, include_buffers):
                return
            self.__init__()  # type: ignore[misc]
        for n, m in model.named_modules(remove_duplicate=False):
            self.modules.append(n)
            self.module_objects.append(m)
        for n, t in model.named_parameters(remove_duplicate=False):
            self.add(n, "parameter", *_split(n), t)
        if include_buffers:
            for n, b in model.named_buffers(remove_duplicate=False):
                self.add(n, "buffer", *_split(n), b)

    def _stack_walk(self, model: nn.Module, include_buffers: bool) -> bool:
        """Every module, then its parameters, then (after all parameters) the buffers; False
        (nothing kept) where some module overrides ``named_modules``: start again with the methods.

        ``add`` written out, for parameters: this loop is the whole cost of an inventory.
        """
        plain = nn.Module.named_modules
        modules, objects, entries, unique, first = self.modules, self.module_objects, self.entries, \
            self.unique, self.first
        keys = self.keys
        tensors = keys._tensors
        owners: list[tuple[str, str, dict]] = []  # (module name, its prefix, its _buffers) with buffers
        spans: list[tuple[str, int, int]] = []  # (module name, start, end): its parameters, its buffers
        stack: list[tuple[str, nn.Module]] = [("", model)]
        new, entry = tuple.__new__, TensorEntry  # TensorEntry(...) without its keyword handling
        while stack:
            prefix, module = stack.pop()
            if type(module).named_modules is not plain:
                return False
            modules.append(prefix)
            objects.append(module)
            dot = prefix + "." if prefix else ""
            start = len(entries)
            for k, v in module._parameters.items():
                if v is None:
                    continue
                i = len(entries)
                j = first.setdefault(id(v), i)
                if j == i:
                    obj = len(tensors)
                    unique.append(i)
                    tensors.append(v)
                    name = dot + k
                    entries.append(new(entry, (name, "parameter", prefix, k, v, name, obj, keys)))
                else:
                    self.add(dot + k, "parameter", prefix, k, v, j)
            if len(entries) > start:
                spans.append((prefix, start, len(entries)))
            if include_buffers and module._buffers:
                owners.append((prefix, dot, module._buffers))
            for k, m in reversed(module._modules.items()):
                if m is not None:
                    stack.append((dot + k, m))
        add = self.add
        for prefix, dot, buffers in owners:
            start = len(entries)
            for k, v in buffers.items():
                if v is not None:
                    add(dot + k, "buffer", prefix, k, v)
            if len(entries) > start:
                spans.append((prefix, start, len(entries)))
        self.spans = spans
        return True


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
                           include_buffers, tuple(b.modules), tuple(b.module_objects), b.keys,
                           None if b.spans is None else tuple(b.spans))
