"""Which piece of a tensor-parallel module's output a capture holds.

``parallelize_module`` adds output hooks that turn a module's DTensor output into this rank's
local tensor (``ColwiseParallel``: a block of columns) or gather it. A capture sees what the
module returned to its caller, a plain tensor: a hook placed before those hooks records the
DTensor's placement, so the capture can say whether it holds a piece, and which one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..utils.dtensors import dtensor_type, is_dtensor, placements_text
from ..utils.findings import Finding


@contextmanager
def output_placements(named: list[tuple[str, nn.Module]]) -> Iterator[dict[str, dict[str, Any]]]:
    """Record, for each module with DTensor parameters of its own, the placement of its DTensor
    output, before the module's own output hooks run. Hooks are removed when the block ends."""
    seen: dict[str, dict[str, Any]] = {}
    handles = []
    try:
        cls = dtensor_type()  # None: torch.distributed.tensor was never imported, no DTensor exists
        # the module's own parameters, read from its dict: this runs for every module of every capture
        owners = [] if cls is None else [(name, module) for name, module in named
                                         if any(isinstance(p, cls) for p in module._parameters.values())]
        for name, module in owners:
            handles.append(module.register_forward_hook(_recorder(name, seen), prepend=True))
        yield seen
    finally:
        for h in handles:
            h.remove()


def _recorder(name: str, seen: dict[str, dict[str, Any]]) -> Any:
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        if is_dtensor(output) and name not in seen:
            mesh = output.device_mesh
            seen[name] = {"placements": placements_text(output), "mesh": tuple(mesh.shape),
                          "coordinate": mesh.get_coordinate(), "shape": tuple(output.shape),
                          "local_shape": tuple(output._local_tensor.shape)}
    return hook


def placement_notes(
    seen: dict[str, dict[str, Any]], outputs: dict[str, Any]
) -> tuple[dict[str, str], list[Finding]]:
    """For each captured output that a DTensor placement made: what it holds, and a finding when
    it is only this rank's piece."""
    rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    notes: dict[str, str] = {}
    findings = []
    for name, facts in seen.items():
        captured = outputs.get(name)
        where = (f"rank {rank} (mesh coordinate {list(facts['coordinate'] or [])}) of a DTensor placed "
                 f"{facts['placements']} on mesh {list(facts['mesh'])}")
        if is_dtensor(captured):
            notes[name] = f"DTensor placed {captured.placements}"
        elif isinstance(captured, torch.Tensor) and tuple(captured.shape) != facts["shape"] and \
                tuple(captured.shape) == facts["local_shape"]:
            notes[name] = f"piece of {where}"
            findings.append(
                Finding(
                    "capture-shard",
                    "info",
                    name,
                    f"the captured output of {name} is this rank's piece, not the whole output: "
                    f"{where}, shape {list(captured.shape)} of the global {list(facts['shape'])}. "
                    "Every rank holds another piece; gather them (DTensor.full_tensor) for the whole output.",
                )
            )
        else:
            notes[name] = f"whole output (the module computed it as {facts['placements']})"
    return notes, findings
