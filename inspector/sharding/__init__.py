"""What this rank holds of a model whose tensors are DTensors (FSDP2, tensor parallelism).

The single-model analyses call into here when a model has DTensor parameters: ``offset_map``
adds this rank's pieces (:func:`with_local_offsets`), ``gradient_report`` measures sharded
gradients (:class:`ShardedGradients`, :func:`with_rank_columns`), ``placement_table`` adds the
bytes per rank (:func:`with_rank_bytes`, :func:`sharding_tables`) and ``capture_activations``
says which piece of an output it holds (:func:`output_placements`, :func:`placement_notes`).
Facts of one model on this rank only: comparing ranks is ``inspector.distributed``'s work.

Modules: ``findings``: findings about the ranks of a run that hold pieces of one tensor; ``outputs``:
which piece of a tensor-parallel module's output a capture holds; ``gradients``: gradient norms of a
model whose parameters are DTensors; ``tables``: dTensor columns for the single-model analyses.
"""

from __future__ import annotations

from .findings import nonfinite_by_rank, ranks_text
from .gradients import DTENSOR_NORM_COLUMNS, ShardedGradients, with_rank_columns
from .outputs import output_placements, placement_notes
from .tables import (
    LOCAL_OFFSET_COLUMNS,
    bytes_per_rank,
    mesh_dims,
    rank_bytes,
    sharding_tables,
    with_local_offsets,
    with_rank_bytes,
)

__all__ = ["DTENSOR_NORM_COLUMNS", "LOCAL_OFFSET_COLUMNS", "ShardedGradients", "bytes_per_rank", "mesh_dims",
           "nonfinite_by_rank", "output_placements", "placement_notes", "rank_bytes", "ranks_text",
           "sharding_tables", "with_local_offsets", "with_rank_bytes", "with_rank_columns"]
