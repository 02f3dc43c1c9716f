"""Distributed training (torch.distributed, FSDP2, DTensor): per-step checks and merged runs.

Under ``torchrun``, call :func:`check_step` on every rank after the backward pass; rank 0
appends one row per step to the run file the watch writes, which :func:`read_run` (the same
function as ``inspector.read_run``), ``python -m inspector report`` and the Training page read::

    from inspector.distributed import check_step
    check_step(model, step, "run.inspect")

Modules: ``columns``: every rank's numbers of one ``check_step`` call as columns; ``digest``: cheap
per-step digests of this rank's tensor pieces; ``findings``: findings of one distributed step;
``local``: one rank's numbers at one ``check_step`` call; ``plan``: what ``check_step`` works out once
per model and keeps between steps; ``sync``: before any collective; ``check``: ``check_step``: one call
per training step; ``train``: run a few training steps of a model under torch.distributed;
``groups``: process groups made and ended in order, never left to the garbage collector.
"""

from __future__ import annotations

from ..loading.dcp import dcp_listing, is_dcp_folder, read_dcp, read_metadata
from ..runfiles import DistributedRun, Run, is_run_file, rank_issues, read_run, unique_findings
from ..sharding import mesh_dims, rank_bytes
from ..utils.dtensors import is_dtensor, local_piece, model_has_dtensors, placements_text
from .check import StepCheck, check_step
from .digest import PARTS
from .groups import end_group, process_group, release_wrapper, settle
from .train import SHARD_MODES, fsdp_units, rank_device, shard, sharded, train_and_check

__all__ = ["StepCheck", "check_step", "DistributedRun", "Run", "read_run", "is_run_file",
           "unique_findings", "is_dtensor", "local_piece", "model_has_dtensors", "placements_text",
           "rank_issues", "dcp_listing", "is_dcp_folder",
           "SHARD_MODES", "process_group", "end_group", "release_wrapper", "settle",
           "rank_device", "shard", "sharded", "train_and_check",
           "PARTS", "fsdp_units", "mesh_dims", "rank_bytes", "read_dcp", "read_metadata"]
