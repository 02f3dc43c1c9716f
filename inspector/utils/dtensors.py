"""DTensor facts read from metadata: local shards, placements, meshes, replicated tensors.

FSDP2 (``fully_shard``) and tensor parallelism (``parallelize_module``) turn parameters
into ``torch.distributed.tensor.DTensor``: ``shape`` and ``numel()`` are the global ones,
``to_local()`` is this rank's piece. Everything here works on plain tensors too, so the
analyses can call it for every tensor without asking first.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.tensor import DTensor
    from typing_extensions import TypeIs


def dtensor_type() -> type | None:
    """``DTensor``, or None while ``torch.distributed.tensor`` was never imported.

    Importing it costs seconds, and no DTensor can exist before it is imported (FSDP2 and
    ``parallelize_module`` import it), so the analyses never import it themselves.
    """
    module = sys.modules.get("torch.distributed.tensor")
    return getattr(module, "DTensor", None) if module is not None else None


def is_dtensor(t: object) -> TypeIs[DTensor]:
    """Whether ``t`` is a DTensor (a parameter of an FSDP2 or tensor-parallel module).

    >>> is_dtensor(torch.zeros(2))
    False
    """
    cls = dtensor_type()
    return cls is not None and isinstance(t, cls)


def has_dtensors(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether any of ``tensors`` is a DTensor."""
    cls = dtensor_type()
    return cls is not None and any(isinstance(t, cls) for t in tensors)


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
    if dim is not None and splits(p):
        factor = _split_factor(p)
        return f"{name}({dim}, split_factor={factor})" if factor != 1 else f"{name}({dim})"
    return f"{name}()"


def splits(p: Any) -> bool:
    """Whether placement ``p`` splits a dimension: ``Shard`` or ``_StridedShard`` (which is not a
    ``Shard`` for ``is_shard()`` in recent torch)."""
    return bool(p.is_shard()) or getattr(p, "split_factor", None) is not None


def _split_factor(p: object) -> int:
    """1 for ``Shard``; the split factor of a ``_StridedShard`` (FSDP2 over tensor parallel)."""
    return int(getattr(p, "split_factor", 1) or 1)


def is_sharded(t: torch.Tensor) -> bool:
    """Whether some mesh dimension splits ``t`` (``Shard`` or ``_StridedShard``)."""
    return is_dtensor(t) and any(splits(p) for p in t.placements)


def piece_layout(t: torch.Tensor, coordinate: Sequence[int]) -> tuple[list[int], list[int] | None]:
    """Shape of the piece of DTensor ``t`` that the rank at mesh ``coordinate`` holds, and its offset
    in each global dimension (None when the piece is not one block: ``_StridedShard``).

    ``Shard(d)`` splits the current size of dimension ``d`` as ``torch.chunk`` does, mesh
    dimension by mesh dimension; ``Replicate()`` and ``Partial()`` hold the whole size.
    ``_StridedShard(d, split_factor=f)`` (FSDP2 over tensor parallel) splits ``d`` into
    ``n * f`` chunks of which the rank takes every ``n``-th: the size is exact, the piece is
    ``f`` separate blocks.
    """
    dt = cast("DTensor", t)
    shape = list(dt.shape)
    offset: list[int] | None = [0] * len(shape)
    for i, p in enumerate(cast(Sequence[Any], dt.placements)):
        if not splits(p):  # Replicate, Partial: the whole current size
            continue
        dim, parts, at = p.dim, dt.device_mesh.size(i), int(coordinate[i])
        size, factor = shape[dim], _split_factor(p)
        if factor == 1:
            chunk = -(-size // parts)
            start = min(at * chunk, size)
            shape[dim] = min(start + chunk, size) - start
            if offset is not None:
                offset[dim] += start
            continue
        chunk = -(-size // (parts * factor))
        bounds = [(min(k * chunk, size), min((k + 1) * chunk, size)) for k in range(parts * factor)]
        shape[dim] = sum(b - a for a, b in bounds[at::parts])
        offset = None
    return shape, offset


@dataclass(frozen=True)
class LocalPiece:
    """Where this rank's piece of a tensor sits inside the global tensor, flattened.

    ``start``/``end`` are element offsets into the global tensor flattened in row-major
    order; they form one contiguous range only when the piece is a block of leading rows
    (``Shard(0)`` on a 1-D mesh, the FSDP2 default); otherwise ``contiguous`` is False and
    ``start`` is the offset of the piece's first element, or -1 when it is not known
    (``_StridedShard``: the piece is several blocks).
    """

    numel: int
    start: int
    end: int
    contiguous: bool
    shape: tuple[int, ...]


def local_piece(t: torch.Tensor) -> LocalPiece:
    """This rank's piece of ``t``: the whole tensor for a plain or replicated one.

    ``numel`` and ``shape`` are those of the local tensor itself.
    """
    n = t.numel()
    if not is_dtensor(t):
        return LocalPiece(n, 0, n, True, tuple(t.shape))
    shape = tuple(t.to_local().shape)
    numel = math.prod(shape)
    coordinate = t.device_mesh.get_coordinate()
    if coordinate is None:  # this rank is not in the mesh: it holds nothing
        return LocalPiece(numel, 0, 0, numel == 0, shape)
    _, offsets = piece_layout(t, coordinate)
    if offsets is None:
        return LocalPiece(numel, -1, -1, False, shape)
    start = 0
    stride = 1
    for dim in range(len(t.shape) - 1, -1, -1):
        start += offsets[dim] * stride
        stride *= t.shape[dim]
    # a block of whole leading rows is contiguous in the flattened tensor
    contiguous = all(shape[d] == t.shape[d] for d in range(1, len(shape))) if shape else True
    return LocalPiece(numel, start, start + numel if contiguous else start, contiguous, shape)


def _own_parameters(unit: nn.Module, units: set[int]) -> list[torch.Tensor]:
    """The parameters an FSDP2 unit manages: those below it that no nested unit manages."""
    out: list[torch.Tensor] = list(unit.parameters(recurse=False))
    stack = list(unit.children())
    while stack:
        m = stack.pop()
        if id(m) in units:
            continue
        out.extend(m.parameters(recurse=False))
        stack.extend(m.children())
    return out


@contextmanager
def kept_sharded(model: nn.Module, modules: Iterable[nn.Module] | None = None) -> Iterator[None]:
    """Reshard the FSDP2 units that were sharded before, once the block exits.

    ``modules`` are the model's modules when the caller has walked them already.

    FSDP2 leaves the root unit's parameters gathered after a forward pass (it expects a
    backward pass next); an inspection's forward pass must leave the model as it found it.
    A unit the caller left gathered (between their forward and backward) stays gathered.
    """
    fsdp = sys.modules.get("torch.distributed.fsdp")  # FSDP2 imports it; without it there is no unit
    unit_type = getattr(fsdp, "FSDPModule", None)
    if unit_type is None:
        yield
        return
    units = [m for m in (model.modules() if modules is None else modules) if isinstance(m, unit_type)]
    ids = {id(m) for m in units}
    sharded = [m for m in units if all(is_dtensor(p) for p in _own_parameters(m, ids))]
    try:
        yield
    finally:
        for m in sharded:
            m.reshard()


def split_dims(t: torch.Tensor) -> list[int]:
    """Mesh dimensions on which the ranks of ``t``'s mesh hold different values: ``Shard``,
    ``_StridedShard`` and ``Partial`` (pending sums); ``Replicate`` dimensions hold copies."""
    if not is_dtensor(t):
        return []
    return [i for i, p in enumerate(cast(Sequence[Any], t.placements)) if splits(p) or p.is_partial()]


def replica_key(t: torch.Tensor, world: int) -> int:
    """Ranks with the same key hold the same local values of ``t``; -1 when no two ranks of a
    ``world``-rank group do (every rank holds a piece of its own).

    The key is this rank's coordinate on the mesh dimensions that split ``t``. A DTensor on a
    sub-mesh (FSDP on the data-parallel dimension of a 2-D mesh) has a copy of that sub-mesh on
    every other rank of the group: ranks at the same coordinate of their own sub-mesh hold the
    same piece, so they share a key. A plain tensor is the same on every rank: key 0.
    """
    if not is_dtensor(t):
        return 0 if world > 1 else -1
    mesh = t.device_mesh
    coordinate = mesh.get_coordinate()
    dims = split_dims(t)
    pieces = math.prod(mesh.size(i) for i in dims)
    if coordinate is None or pieces >= world:
        return -1
    key = 0
    for i in dims:
        key = key * mesh.size(i) + coordinate[i]
    return key


def holders(t: torch.Tensor, world: int) -> float:
    """How many ranks of a ``world``-rank group hold each element of ``t``: the group size over
    the number of distinct pieces; 0 when a ``Partial`` placement hides the values (pending sums);
    NaN for a plain tensor (every rank has all of it)."""
    if not is_dtensor(t):
        return math.nan
    if any(p.is_partial() for p in cast(Sequence[Any], t.placements)):
        return 0.0
    pieces = math.prod(t.device_mesh.size(i) for i in split_dims(t))
    return max(world / pieces, 1.0)


def rank_coordinates(mesh: Any) -> list[tuple[int, list[int]]]:
    """(global rank, coordinate in ``mesh``) for every rank that holds a copy of ``mesh``.

    A sub-mesh (``mesh_2d["dp"]``) is one of several copies, one per coordinate of the other
    dimensions of its root mesh: every rank of the root has a coordinate in its own copy.
    Without a root mesh (or names to map it), the ranks of ``mesh`` itself.
    """
    import numpy as np

    root = getattr(mesh, "_get_root_mesh", lambda: mesh)()
    names, root_names = mesh.mesh_dim_names, root.mesh_dim_names
    if root is not mesh and names and root_names and all(n in root_names for n in names):
        dims = [root_names.index(n) for n in names]
        ranks = root.mesh.reshape(-1).tolist()
        return [(int(r), [int(np.unravel_index(flat, tuple(root.shape))[d]) for d in dims])
                for flat, r in enumerate(ranks)]
    ranks = mesh.mesh.reshape(-1).tolist()
    return [
        (int(r), [int(c) for c in np.unravel_index(flat, tuple(mesh.shape))]) for flat, r in enumerate(ranks)
    ]


def default_store() -> Any:
    """The default process group's key-value store (None without one, or where torch keeps it out of
    reach): what the ranks meet through, outside the collectives."""
    import torch.distributed as dist

    getter = getattr(dist.distributed_c10d, "_get_default_store", None)
    try:
        return getter() if getter is not None else None
    except (RuntimeError, ValueError):
        return None

