"""Every rank's numbers and findings of a step, on every rank: one ``all_gather`` of one vector, and one
object gather at a step where a rank has findings to share."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..utils.findings import Finding
from .layout import Layout
from .numbers import Numbers


def gather_numbers(numbers: Numbers, layout: Layout, world: int, group: Any) -> list[Numbers]:
    """Every rank's numbers of this step, on every rank (one ``all_gather`` of one vector)."""
    if world == 1:
        return [numbers]
    device = torch.device("cpu")
    if "nccl" in str(dist.get_backend(group)).lower() and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    moved = numbers.pack().to(device)
    out = [torch.empty_like(moved) for _ in range(world)]
    dist.all_gather(out, moved, group=group)
    sizes = len(layout.modules), len(layout.parameters), len(layout.buffers)
    return [Numbers.unpack(o.cpu().numpy(), *sizes) for o in out]


def merge_findings(own: list[Finding], numbers_all: list[Numbers], world: int,
                   group: Any) -> list[list[Finding]]:
    """Every rank's findings (``own`` here), on every rank: one object gather, only at a step where a
    rank has some (``Numbers.shared``)."""
    if world == 1:
        return [own]
    if not any(n.shared for n in numbers_all):
        return [[] for _ in numbers_all]
    box: list[Any] = [None] * world
    dist.all_gather_object(box, [f.to_dict() for f in own], group=group)
    return [[Finding(**d) for d in b] for b in box]


__all__ = ["gather_numbers", "merge_findings"]
