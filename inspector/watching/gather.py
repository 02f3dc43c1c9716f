"""Every rank's numbers and findings of a step, on every rank: one ``all_gather`` of one vector (with
the distributed check's numbers at a check step), and one object gather at a step where a rank has
findings to share."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from ..utils.findings import Finding
from .layout import Layout
from .numbers import Numbers


def gather_numbers(numbers: Numbers, layout: Layout, world: int, group: Any,
                   extra: torch.Tensor | None = None) -> tuple[list[Numbers], torch.Tensor | None]:
    """Every rank's numbers of this step, on every rank (one ``all_gather`` of one vector), and every
    rank's ``extra`` float64 vector sent in the same gather (a (world, len) tensor), if given."""
    if world == 1:
        return [numbers], None if extra is None else extra.unsqueeze(0)
    device = torch.device("cpu")
    if "nccl" in str(dist.get_backend(group)).lower() and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    own = numbers.pack()
    width = len(own)
    moved = (own if extra is None else torch.cat([own, extra.to(own.device)])).to(device)
    out = [torch.empty_like(moved) for _ in range(world)]
    dist.all_gather(out, moved, group=group)
    rows = torch.stack(out).cpu()
    sizes = len(layout.modules), len(layout.parameters), len(layout.buffers)
    return ([Numbers.unpack(row[:width].numpy(), *sizes) for row in rows],
            None if extra is None else rows[:, width:].contiguous())


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
