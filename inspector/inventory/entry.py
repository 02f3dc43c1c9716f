"""One name of one tensor, as the walk met it."""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..utils.dtensors import dtensor_type
from .keys import StorageKeys

KINDS = ("parameter", "buffer")


class TensorEntry(NamedTuple):
    """One name of one tensor, as the walk met it (an immutable record).

    The walk records who holds the tensor and the name that object was first met under;
    everything else, the storage key too, is read from the tensor when asked, so a walk over
    a model with a million names stays as fast as ``named_parameters()`` itself.

    Attributes:
        name: full dotted name (``"h.0.attn.c_attn.weight"``).
        kind: ``"parameter"`` or ``"buffer"``.
        module: name of the module that holds it under ``attr`` (``""`` for the root).
        attr: the key in that module's ``_parameters`` or ``_buffers``.
        tensor: the tensor itself (kept alive while the inventory lives).
        first_name: the first name of the same object: what ``named_parameters()`` (or
            ``named_buffers()``) keeps; equal to ``name`` for the first holder.
        obj: number of the object: index into :attr:`TensorInventory.unique`.
        storage_keys: the keys of the inventory's objects, shared by all its entries; read
            :attr:`storage_key` instead.
    """

    name: str
    kind: str
    module: str
    attr: str
    tensor: torch.Tensor
    first_name: str
    obj: int
    storage_keys: StorageKeys

    @property
    def storage_key(self) -> tuple | None:
        """:func:`storage_key` of the tensor, or None (always for a DTensor); read once per
        inventory, on first ask (:class:`StorageKeys`)."""
        return self.storage_keys[self.obj]

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
        cls = dtensor_type()
        return cls is not None and isinstance(self.tensor, cls)

    @property
    def local_shape(self) -> tuple[int, ...]:
        """Shape of this rank's piece (``shape`` for a plain tensor)."""
        return tuple(self._local().shape)

    @property
    def local_nbytes(self) -> int:
        """Bytes of this rank's piece (``nbytes`` for a plain tensor)."""
        t = self._local()
        return t.numel() * t.element_size()

    def _local(self) -> torch.Tensor:
        """This rank's piece of a DTensor (``to_local()``), else the tensor itself."""
        return self.tensor.to_local() if self.is_dtensor else self.tensor  # type: ignore[attr-defined]

    @property
    def placements(self) -> str:
        """DTensor placements as text (``"Shard(0)"``), ``""`` for a plain tensor."""
        if not self.is_dtensor:
            return ""
        from ..utils.dtensors import placements_text

        return placements_text(self.tensor)

    @property
    def mesh(self) -> tuple[int, ...]:
        """Shape of the DTensor's device mesh, ``()`` for a plain tensor."""
        return tuple(self.tensor.device_mesh.shape) if self.is_dtensor else ()  # type: ignore[attr-defined]
