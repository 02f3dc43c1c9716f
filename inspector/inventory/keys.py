"""Storage keys: which tensors share memory, read once per inventory on first ask."""

from __future__ import annotations

import torch

from ..utils.dtensors import dtensor_type


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


class StorageKeys:
    """The :func:`storage_key` of each object of one inventory, read on first ask and then kept.

    Reading a storage key costs more than the rest of the walk over that tensor (a storage
    object is made to read its address), and most readers of an inventory never group by
    memory, so keys are not read during the walk. The first time any key of an inventory is
    asked for (:attr:`TensorEntry.storage_key`, :attr:`TensorInventory.by_storage`,
    :meth:`TensorInventory.storage_groups`), the keys of every object are read together and
    kept: from then on they stay fixed for the inventory's life, like the rest of it, and all
    readers see the same keys. They describe the storages as they were at that first ask; an
    inventory describes one model state, so walk again after changing the model (replacing
    ``.data``, moving, converting), as for every other fact it holds. A DTensor's key is None.
    """

    __slots__ = ("_tensors", "_keys")

    def __init__(self) -> None:
        self._tensors: list[torch.Tensor] = []  # first-seen order: index = object number
        self._keys: list[tuple | None] | None = None

    def __getitem__(self, obj: int) -> tuple | None:
        return self.all()[obj]

    def all(self) -> list[tuple | None]:
        """Every object's key, object-number order (read now if not read yet)."""
        keys = self._keys
        if keys is None:
            dtensor = dtensor_type()
            keys = self._keys = [None if dtensor is not None and isinstance(t, dtensor) else storage_key(t)
                                 for t in self._tensors]
        return keys

    def __repr__(self) -> str:
        return (
            f"StorageKeys({len(self._tensors)} objects, {'read' if self._keys is not None else 'not read'})"
        )
