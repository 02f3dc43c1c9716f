"""One walk over a model's parameters and buffers, with every name, owner and storage.

Every analysis that groups tensors by identity or by memory starts here:
``named_parameters(remove_duplicate=False)`` then ``named_buffers(remove_duplicate=False)``,
one entry per name, each holding its tensor (so ``id()``s are not reused while the
inventory lives) and the name ``named_parameters()`` keeps for that object. Storage keys
are read when first asked for (see :class:`StorageKeys`), so a walk whose reader never
groups by memory pays nothing for them. DTensors (FSDP2, tensor parallelism) carry their
global shape and this rank's local shape and bytes; ``torch.distributed.tensor`` is never
imported here.

- :mod:`.walk`: :func:`tensor_inventory`, the one walk;
- :mod:`.tables`: :class:`TensorInventory`, its entries grouped by object, storage and module, and
  :class:`ModuleTables`, the modules with their children and bytes by prefix;
- :mod:`.entry`: :class:`TensorEntry`, one name of one tensor;
- :mod:`.keys`: :func:`storage_key` and :class:`StorageKeys`.
"""

from __future__ import annotations

from .entry import KINDS, TensorEntry
from .keys import StorageKeys, storage_key
from .tables import ModuleTables, TensorInventory
from .walk import tensor_inventory

__all__ = [
    "KINDS",
    "ModuleTables",
    "StorageKeys",
    "TensorEntry",
    "TensorInventory",
    "storage_key",
    "tensor_inventory",
]
