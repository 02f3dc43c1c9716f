"""DTensor facts read from metadata: local shards, placements, meshes, replicated tensors.

FSDP2 (``fully_shard``) and tensor parallelism (``parallelize_module``) turn parameters
into ``torch.distributed.tensor.DTensor``: ``shape`` and ``numel()`` are the global ones,
``to_local()`` is this rank's piece. Everything here works on plain tensors too, so the
analyses can call it for every tensor without asking first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

try:  # public since torch 2.4
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - torch built without distributed
    DTensor = None  # type: ignore[assignment,misc]


def is_dtensor(t: object) -> bool:
    """Whether ``t`` is a DTensor (a parameter of an FSDP2 or tensor-parallel module).

    >>> is_dtensor(torch.zeros(2))
    False
    """
    return DTensor is not None and isinstance(t, DTensor)


def has_dtensors(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether any of ``tensors`` is a DTensor."""
    return any(is_dtensor(t) for t in tensors)


def model_has_dtensors(model: nn.Module) -> bool:
    """Whether any parameter or buffer of ``model`` is a DTensor."""
    return has_dtensors(model.parameters()) or has_dtensors(model.buffers())


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's piece of ``t`` (``t`` itself for a plain tensor)."""
    return t.to_local() if is_dtensor(t) else t


def placements_text(t: torch.Tensor) -> str:
    """``"Shard(0)"``, ``"Replicate(), Shard(0)"``..., or ``""`` for a plain tensor."""
    if not is_dtensor(t):
        return ""
    return ", ".join(_placement(p) for p in t.placements)


def _placement(p: object) -> str:
    dim = getattr(p, "dim", None)
    name = type(p).__name__
    if dim is not None and name.endswith("Shard"):
        return f"{name}({dim})"
    return f"{name}()"


def mesh_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The device mesh's shape, ``()`` for a plain tensor."""
    return tuple(t.device_mesh.shape) if is_dtensor(t) else ()


def replicated_dims(t: torch.Tensor) -> tuple[int, ...]:
    """Mesh dimensions over which ``t`` is replicated (every rank on them holds the same piece)."""
    if not is_dtensor(t):
        return ()
    return tuple(i for i, p in enumerate(t.placements) if type(p).__name__ == "Replicate")


def is_sharded(t: torch.Tensor) -> bool:
    """Whether some mesh dimension splits ``t`` (``Shard`` or ``_StridedShard``)."""
    return is_dtensor(t) and any(type(p).__name__.endswith("Shard") for p in t.placements)


@dataclass(frozen=True)
class LocalPiece:
    """Where this rank's piece of a tensor sits inside the global tensor, flattened.

    ``start``/``end`` are element offsets into the global tensor flattened in row-major
    order; they form one contiguous range only when the piece is a block of leading rows
    (``Shard(0)`` on a 1-D mesh, the FSDP2 default); otherwise ``contiguous`` is False and
    ``start`` is the offset of the piece's first element.
    """

    numel: int
    start: int
    end: int
    contiguous: bool
    shape: tuple[int, ...]


def local_piece(t: torch.Tensor) -> LocalPiece:
    """This rank's piece of ``t``: the whole tensor for a plain or replicated one."""
    n = t.numel()
    if not is_dtensor(t):
        return LocalPiece(n, 0, n, True, tuple(t.shape))
    shape = tuple(t.to_local().shape)
    numel = 1
    for s in shape:
        numel *= s
    offsets = _global_offset(t)
    start = 0
    stride = 1
    for dim in range(len(t.shape) - 1, -1, -1):
        start += offsets[dim] * stride
        stride *= t.shape[dim]
    # a block of whole leading rows is contiguous in the flattened tensor
    contiguous = all(shape[d] == t.shape[d] for d in range(1, len(shape))) if shape else True
    return LocalPiece(numel, start, start + numel if contiguous else start, contiguous, shape)


def _global_offset(t: torch.Tensor) -> tuple[int, ...]:
    """Offset of the local piece in each global dimension (``torch.chunk`` split per mesh dim)."""
    shape = list(t.shape)
    offset = [0] * len(shape)
    coordinate = t.device_mesh.get_coordinate()
    if coordinate is None:  # this rank is not in the mesh: it holds nothing
        return tuple(offset)
    for i, p in enumerate(t.placements):
        dim = getattr(p, "dim", None)
        if dim is None or type(p).__name__ != "Shard":
            continue
        size, parts = shape[dim], t.device_mesh.size(i)
        chunk = -(-size // parts)
        start = min(coordinate[i] * chunk, size)
        stop = min(start + chunk, size)
        offset[dim] += start
        shape[dim] = stop - start
    return tuple(offset)


@contextmanager
def kept_sharded(model: nn.Module) -> Iterator[None]:
    """Reshard the FSDP2 units that were sharded before, once the block exits.

    FSDP2 leaves the root unit's parameters gathered after a forward pass (it expects a
    backward pass next); an inspection's forward pass must leave the model as it found it.
    """
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # pragma: no cover - torch built without distributed
        yield
        return
    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    sharded = units if units and model_has_dtensors(model) else []
    try:
        yield
    finally:
        for m in sharded:
            m.reshard()
