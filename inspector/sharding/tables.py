"""DTensor columns for the single-model analyses: this rank's pieces and the bytes per rank.

``offset_map`` and ``placement_table`` call into here when a model's
parameters are DTensors (FSDP2, tensor parallelism): their ``shape``/``numel`` are global,
so the global columns stay as they are and this adds what this rank holds.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
from torch import nn

from ..inventory import TensorInventory, tensor_inventory
from ..utils.dtensors import (
    is_dtensor,
    is_sharded,
    local_piece,
    piece_layout,
    placements_text,
    rank_coordinates,
)

LOCAL_OFFSET_COLUMNS = ["local_start", "local_end", "local_numel", "piece_start", "piece_end",
                        "placements", "mesh"]


def with_local_offsets(table: pd.DataFrame, tensors: list[torch.Tensor]) -> pd.DataFrame:
    """``offset_map`` rows plus this rank's piece of each tensor.

    ``local_start/local_end``: offsets in this rank's flat vector of local pieces
    (``parameters_to_vector(p.to_local() for p ...)``); ``local_numel``: elements this rank
    holds; ``piece_start/piece_end``: the global flat indices the piece covers (``piece_end``
    is -1 when the piece is not one contiguous range, e.g. ``Shard(1)``; both are -1 when
    the piece is several blocks, ``_StridedShard``); ``placements``
    and ``mesh`` as DTensor says (``""`` and ``()`` for plain tensors).
    """
    local_start, local_end, local_numel, piece_start, piece_end, placements, mesh = ([] for _ in range(7))
    offset = 0
    for start, t in zip(table["start"].tolist(), tensors, strict=True):
        piece = local_piece(t)
        local_start.append(offset)
        offset += piece.numel
        local_end.append(offset)
        local_numel.append(piece.numel)
        piece_start.append(start + piece.start if piece.start >= 0 else -1)
        piece_end.append(start + piece.end if piece.contiguous else -1)
        placements.append(placements_text(t))
        mesh.append(tuple(t.device_mesh.shape) if is_dtensor(t) else ())
    out = table.copy()
    for col, values in zip(LOCAL_OFFSET_COLUMNS, (local_start, local_end, local_numel, piece_start, piece_end,
                                                  placements, mesh), strict=True):
        out[col] = np.asarray(values, dtype=np.int64) if col not in ("placements", "mesh") else values
    return out


def bytes_per_rank(t: torch.Tensor) -> dict[int, int]:
    """Bytes of ``t`` each rank holds (global rank -> bytes): this rank's from its local tensor,
    the others' from the placements (:func:`~.tensors.piece_layout`). A tensor on a sub-mesh of a
    2-D mesh (FSDP on the data-parallel dimension next to tensor parallelism) is held by every
    rank of the root mesh, at that rank's coordinate in its own copy of the sub-mesh."""
    if not is_dtensor(t):
        return {}
    size = t.element_size()
    out = {rank: int(math.prod(piece_layout(t, coordinate)[0])) * size
           for rank, coordinate in rank_coordinates(t.device_mesh)}
    if t.device_mesh.get_coordinate() is not None and dist.is_available() and dist.is_initialized():
        out[dist.get_rank()] = t.to_local().numel() * size
    return out


def with_rank_bytes(table: pd.DataFrame, inventory: TensorInventory) -> pd.DataFrame:
    """``placement_table`` rows plus ``placements``, ``mesh``, ``local_bytes`` (this rank) and
    ``bytes_per_rank`` (global rank -> bytes, from the placements) and ``sharded`` (some mesh
    dimension splits the tensor); ``inventory`` is the walk the table was made from."""
    tensors = inventory.tensors()
    out = table.copy()
    found = [tensors.get(n) for n in table["name"].tolist()]
    out["placements"] = [placements_text(t) if t is not None else "" for t in found]
    out["mesh"] = [tuple(t.device_mesh.shape) if is_dtensor(t) else () for t in found]
    out["local_bytes"] = [local_piece(t).numel * t.element_size() if t is not None else 0 for t in found]
    out["bytes_per_rank"] = [bytes_per_rank(t) if t is not None else {} for t in found]
    out["sharded"] = [t is not None and is_sharded(t) for t in found]
    return out


def rank_bytes(table: pd.DataFrame) -> pd.DataFrame:
    """Bytes per rank from a ``placement_table`` that has ``bytes_per_rank``: columns ``rank,
    bytes, sharded_bytes, replicated_bytes``."""
    totals: dict[int, list[int]] = {}
    for sharded, per_rank in zip(table["sharded"], table["bytes_per_rank"], strict=True):
        for rank, nbytes in per_rank.items():
            acc = totals.setdefault(rank, [0, 0, 0])
            acc[0] += nbytes
            acc[1 if sharded else 2] += nbytes
    rows = [(r, *v) for r, v in sorted(totals.items())]
    return pd.DataFrame(rows, columns=["rank", "bytes", "sharded_bytes", "replicated_bytes"])


def mesh_dims(model: nn.Module) -> pd.DataFrame:
    """One row per mesh dimension of the model's DTensors: ``mesh, dim, size, placement, tensors,
    local_bytes`` (bytes this rank holds of the tensors placed that way on that dimension)."""
    rows: dict[tuple, list] = {}
    for e in tensor_inventory(model).unique_entries():
        t = e.tensor
        if not is_dtensor(t):
            continue
        local_bytes = e.local_nbytes
        for i, placement in enumerate(placements_text(t).split(", ")):
            key = (tuple(t.device_mesh.shape), i, t.device_mesh.size(i), placement)
            acc = rows.setdefault(key, [0, 0])
            acc[0] += 1
            acc[1] += local_bytes
    data = [(str(k[0]), k[1], k[2], k[3], v[0], v[1]) for k, v in rows.items()]
    return pd.DataFrame(data, columns=["mesh", "dim", "size", "placement", "tensors", "local_bytes"])


def sharding_tables(model: nn.Module, table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(title, table) pairs to show next to a ``placement_table`` of a model with DTensor
    parameters: :func:`rank_bytes` and :func:`mesh_dims`; none for a plain model."""
    if "bytes_per_rank" not in table.columns:
        return []
    return [("Bytes of DTensor parameters and buffers per rank (from their placements)", rank_bytes(table)),
            ("Bytes this rank holds per mesh dimension and placement", mesh_dims(model))]
