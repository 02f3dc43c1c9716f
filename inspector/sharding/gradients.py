"""Gradient norms of a model whose parameters are DTensors: global (as ``clip_grad_norm_``) and local.

``inspector.offsets.gradient_report`` (and ``gradient_norms``, one table of it) measure DTensor gradients with
the one fused pass of ``inspector.offsets.gradient_pass``, through :class:`ShardedGradients`: each
rank measures its local pieces, one ``all_reduce`` per mesh dimension that shards them adds
the squares up, and the per-module sums are the same code as for plain models. This module
then adds this rank's ``local_norm``, the ``placements`` and the ranks holding NaN/Inf.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch
import torch.distributed as dist

from ..utils.dtensors import is_dtensor, placements_text, splits
from ..utils.findings import Finding
from .findings import nonfinite_by_rank

DTENSOR_NORM_COLUMNS = ["local_norm", "placements", "nonfinite_ranks"]


def _initialised() -> bool:
    return dist.is_available() and dist.is_initialized()


def _sharded_dims(g: torch.Tensor) -> tuple[int, ...]:
    """Mesh dimensions whose ranks hold different pieces of ``g`` (their squares add up)."""
    if not is_dtensor(g):
        return ()
    return tuple(i for i, p in enumerate(g.placements) if splits(p))


class ShardedGradients:
    """:class:`inspector.offsets.Pieces` for DTensor gradients (FSDP2, tensor parallel).

    A ``Shard`` mesh dimension splits a gradient: the squared norms of the pieces are summed
    over that dimension's process group. A ``Replicate`` dimension holds copies: nothing to
    add. A ``Partial`` gradient (pending sums) is reduced to ``Replicate`` first, as
    ``clip_grad_norm_`` does. Plain gradients are measured as they are.
    """

    def __init__(self) -> None:
        self.local_squares: dict[int, float] = {}   # id(gradient) -> this rank's squared norm
        self._measured: list[tuple[list[torch.Tensor], torch.Tensor]] = []

    def local(self, grad: torch.Tensor) -> torch.Tensor:
        if not is_dtensor(grad):
            return grad
        if any(p.is_partial() for p in grad.placements):
            from torch.distributed.tensor import Replicate

            grad = grad.redistribute(grad.device_mesh, [Replicate() if p.is_partial() else p
                                                        for p in grad.placements])
        return grad.to_local()

    def reduce(self, squares: torch.Tensor, grads: Sequence[torch.Tensor]) -> torch.Tensor:
        """Record this rank's squares, then add them up over the mesh dimensions that shard each
        gradient: one all_reduce per (mesh, dimensions) group and dimension."""
        self._measured.append((list(grads), squares))
        groups: dict[tuple, list[int]] = {}
        for pos, g in enumerate(grads):
            dims = _sharded_dims(g)
            if dims and is_dtensor(g):
                groups.setdefault((g.device_mesh, dims), []).append(pos)
        if not groups:
            return squares
        out = squares.clone()
        for (mesh, dims), positions in groups.items():
            index = torch.tensor(positions, device=squares.device)
            part = out.index_select(0, index)
            for d in dims:
                dist.all_reduce(part, group=mesh.get_group(d))
            out.index_copy_(0, index, part)
        return out

    def gather_counts(self, counts: torch.Tensor) -> torch.Tensor:
        if not _initialised() or dist.get_world_size() == 1:
            return counts.unsqueeze(0)
        world = dist.get_world_size()
        device = torch.device("cpu")
        if "nccl" in str(dist.get_backend()).lower() and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        moved = counts.to(device)
        out = [torch.empty_like(moved) for _ in range(world)]
        dist.all_gather(out, moved)
        return torch.stack(out).cpu()

    def local_norms(self) -> dict[int, float]:
        """This rank's norm of each gradient the pass measured (one host copy per group)."""
        out: dict[int, float] = {}
        for grads, squares in self._measured:
            for g, v in zip(grads, squares.double().cpu().tolist(), strict=True):
                out[id(g)] = math.sqrt(v) if v >= 0 else math.nan
        return out


def with_rank_columns(
    by_parameter: pd.DataFrame,
    params: Sequence[torch.Tensor],
    gradients: Sequence[torch.Tensor | None],
    pieces: ShardedGradients,
    per_rank: dict[int, list[tuple[int, int]]],
    findings: list[Finding],
) -> tuple[pd.DataFrame, list[Finding]]:
    """The per-parameter table plus ``local_norm``, ``placements`` and ``nonfinite_ranks``; the
    ``nonfinite-gradient`` findings replaced by ones naming the ranks.

    Args:
        by_parameter: rows in the order of ``params`` and ``gradients``.
        per_rank: row index -> (NaN, Inf) counts of each rank's piece, for the nonfinite rows.
    """
    local = pieces.local_norms()
    out = by_parameter.copy()
    out["local_norm"] = [local.get(id(g), math.nan) if g is not None else math.nan for g in gradients]
    out["placements"] = [placements_text(p) for p in params]
    out["nonfinite_ranks"] = [tuple(r for r, (nan, inf) in enumerate(per_rank.get(i, [])) if nan or inf)
                              for i in range(len(gradients))]
    kept = [f for f in findings if f.code != "nonfinite-gradient"]
    names = out["name"].tolist()
    for i, counts in per_rank.items():
        kept += nonfinite_by_rank({"name": names[i], "nan": [c[0] for c in counts],
                                   "inf": [c[1] for c in counts]})
    return out, kept
