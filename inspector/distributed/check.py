"""``check_step``: one call per training step, on every rank, that finds the silent multi-GPU bugs.

Each rank reduces its own tensors to a few numbers per tensor (local gradient sum of
squares, NaN and Inf counts, local element count and two integer hashes of the local
values); one ``all_gather`` of those numbers (O(number of tensors), never the tensors)
gives every rank the same picture, so every rank returns the same findings. Rank 0
appends the step as one JSON line to a file that ``read_run``, ``report`` and the
Distributed page read.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..findings import Finding
from ..wrappers import underlying
from .findings import step_findings
from .tensors import is_dtensor, local, placements_text

FORMAT = "inspector-distributed"
VERSION = 1
# per tensor: local grad sum of squares, NaN, Inf, local numel, has grad, replica key
_PER_TENSOR = 6
# per rank: param bytes, grad bytes, buffer bytes, device allocated, device peak, rss, peak rss
_PER_RANK = 7


@dataclass(frozen=True)
class StepCheck:
    """What ``check_step`` found at one step; the same on every rank.

    ``record`` is the JSON-ready dict rank 0 wrote (see :func:`check_step`).
    """

    step: int
    rank: int
    world_size: int
    record: dict[str, Any] = field(repr=False)
    findings: list[Finding] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No error and no warning."""
        return not any(f.severity in ("error", "warning") for f in self.findings)


def _unique(model: nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    seen: set[int] = set()
    out = []
    for kind, items in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in items:
            if id(t) not in seen:
                seen.add(id(t))
                out.append((name, kind, t))
    return out


def _hash_pair(t: torch.Tensor) -> torch.Tensor:
    """Two int64 sums of the raw bits (all elements, every other one): equal tensors give equal pairs.

    Any one changed element changes the first sum; two elements swapped between even and
    odd positions change the second. Sums accumulate in int64 without copying the tensor.
    """
    flat = t.detach().reshape(-1)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    view = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(flat.element_size())
    if flat.dtype == torch.bool:
        bits = flat.view(torch.int8)
    elif view is None:
        bits = flat.view(torch.uint8)
    else:
        bits = flat.view(view)
    return torch.stack([bits.sum(dtype=torch.int64), bits[::2].sum(dtype=torch.int64)])


def _replica_key(t: torch.Tensor) -> int:
    """Ranks with the same key must hold the same values of ``t``; -1: no rank must."""
    if not is_dtensor(t):
        return 0
    mesh = t.device_mesh
    coordinate = mesh.get_coordinate()
    replicate = [p.is_replicate() for p in t.placements]
    if coordinate is None or not any(replicate):
        return -1
    key = 0
    for i, size in enumerate(mesh.shape):
        key = key * size + (0 if replicate[i] else coordinate[i])
    return key


def _replication(g: torch.Tensor) -> float:
    """How many ranks hold each element of ``g``; NaN when a ``Partial`` placement hides the sum."""
    if not is_dtensor(g):
        return math.nan  # a plain tensor: every rank has all of it; measured from rank 0's copy
    factor = 1
    for i, p in enumerate(g.placements):
        if p.is_replicate():
            factor *= g.device_mesh.size(i)
        elif p.is_partial():
            return 0.0
    return float(factor)


def _memory(device: torch.device) -> list[float]:
    alloc = peak = math.nan
    if device.type == "cuda":
        alloc = float(torch.cuda.memory_allocated(device))
        peak = float(torch.cuda.max_memory_allocated(device))
    rss, peak_rss = _rss()
    return [alloc, peak, rss, peak_rss]


def _rss() -> tuple[float, float]:
    """This process's resident set size and its peak, in bytes, from one reading of
    ``/proc/self/status`` (VmRSS, VmHWM: the same counters, so the peak is never below the
    current value); elsewhere the peak from ``getrusage`` and no current value."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        rss = float(int(fields["VmRSS"].split()[0]) * 1024)
        return rss, max(rss, float(int(fields["VmHWM"].split()[0]) * 1024))
    except (OSError, KeyError, ValueError, IndexError):
        peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        return math.nan, peak * (1.0 if sys.platform == "darwin" else 1024.0)  # macOS counts bytes, Linux KiB


def _collective_device(group: Any) -> torch.device:
    backend = dist.get_backend(group)
    if "nccl" in str(backend).lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _local_numbers(tensors: list[tuple[str, str, torch.Tensor]],
                   with_hashes: bool = True) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """Per-tensor stats (float64) and hashes (int64) of this rank, plus replication factors."""
    stats = [[0.0] * _PER_TENSOR for _ in tensors]
    hashes: dict[int, torch.Tensor] = {}
    replication: list[float] = []
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    grads: dict[int, torch.Tensor] = {}
    for i, (_, kind, t) in enumerate(tensors):
        piece = local(t)
        key = _replica_key(t)
        row = stats[i]
        row[3] = piece.numel()
        row[5] = key
        g = t.grad if kind == "parameter" else None
        replication.append(_replication(g) if g is not None else math.nan)
        if g is not None:
            lg = local(g)
            if lg.layout == torch.strided and lg.numel():
                grads[i] = lg
                groups.setdefault((lg.device, lg.dtype), []).append(i)
            row[4] = 1
        if with_hashes and key >= 0 and row[3]:  # only tensors some other rank must equal
            hashes[i] = _hash_pair(piece)
    for idx in groups.values():
        norms = torch._foreach_norm([grads[i] for i in idx])
        values = torch.stack(norms).double().cpu()
        for i, v in zip(idx, values.tolist()):
            stats[i][0] = v * v
            if not math.isfinite(v):
                g = grads[i]
                stats[i][1] = int(torch.isnan(g).sum())
                stats[i][2] = int(torch.isinf(g).sum())
                if stats[i][1] == 0 and stats[i][2] == 0:  # finite values whose norm overflowed
                    stats[i][0] = float(torch.linalg.vector_norm(g.double())) ** 2
    hash_tensor = torch.zeros(len(tensors), 2, dtype=torch.int64)
    by_device: dict[torch.device, list[int]] = {}
    for i, h in hashes.items():
        by_device.setdefault(h.device, []).append(i)
    for dev_idx in by_device.values():  # one device-to-host copy per device
        hash_tensor[dev_idx] = torch.stack([hashes[i] for i in dev_idx]).cpu()
    return torch.tensor(stats, dtype=torch.float64).reshape(len(tensors), _PER_TENSOR), hash_tensor, replication


def _gather(tensor: torch.Tensor, group: Any, world: int, device: torch.device) -> torch.Tensor:
    if world == 1:
        return tensor.unsqueeze(0)
    moved = tensor.to(device)
    out = [torch.empty_like(moved) for _ in range(world)]
    dist.all_gather(out, moved, group=group)
    return torch.stack(out).cpu()


def check_step(model: nn.Module, step: int, path: str | os.PathLike | None = "inspector-distributed.jsonl", *,
               group: Any = None, note: str = "", far_factor: float = 10.0) -> StepCheck:
    """Compare every rank's gradients, replicas and memory at one training step.

    Call it on every rank after ``loss.backward()`` (before ``optimizer.zero_grad()``), every
    step or every N steps; it reads the model and changes nothing. Without an initialised
    process group it checks this one process.

    Args:
        model: the model of this rank (FSDP2, tensor-parallel, DDP or plain).
        step: the training step number, written to the record.
        path: JSON-lines file rank 0 appends one line to; None writes nothing.
        group: the process group to compare over (default: every rank).
        note: free text stored with the record (a run name, a learning rate...).
        far_factor: a rank whose gradient RMS per element is this many times above or below
            the other ranks' median is reported.

    Returns:
        :class:`StepCheck` with the record and the findings: ``replica-drift`` (a replicated
        parameter or buffer differs; names the tensor and the ranks), ``nonfinite-gradient``
        (by rank and tensor), ``gradient-not-synchronized`` (a plain parameter's gradient
        differs across ranks), ``gradient-far-off``, ``shard-imbalance``.

    >>> m = nn.Linear(2, 1)
    >>> m(torch.ones(1, 2)).sum().backward()
    >>> check_step(m, 0, path=None).record["global"]["grad_norm"] > 0
    True
    """
    record, rank, world = collect(model, step, group=group, note=note)
    findings = step_findings(record, far_factor=far_factor)
    record["findings"] = [f.to_dict() for f in findings]
    if rank == 0 and path is not None:
        append_record(path, record)
    return StepCheck(step, rank, world, record, findings)


def collect(model: nn.Module, step: int = 0, *, group: Any = None, note: str = "",
            hashes: bool = True) -> tuple[dict[str, Any], int, int]:
    """The step record without findings, and this rank and the world size (one all_gather).

    Every rank of ``group`` must call it at the same time (it is a collective).
    """
    tensors = _unique(underlying(model))  # DDP / torch.compile: the names the user wrote
    initialised = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size(group) if initialised else 1
    rank = dist.get_rank(group) if initialised else 0
    device = _collective_device(group) if initialised else torch.device("cpu")
    stats, hash_values, replication = _local_numbers(tensors, hashes)
    first = next((t for _, _, t in tensors), None)
    own = [
        float(sum(local(t).numel() * local(t).element_size() for _, k, t in tensors if k == "parameter")),
        float(sum(local(t.grad).numel() * local(t.grad).element_size()
                  for _, k, t in tensors if k == "parameter" and t.grad is not None)),
        float(sum(local(t).numel() * local(t).element_size() for _, k, t in tensors if k == "buffer")),
    ] + _memory(local(first).device if first is not None else torch.device("cpu"))
    # one all_gather: the int64 hashes travel as float64 bit patterns (copied, never computed on)
    packed = torch.cat([stats.reshape(-1), torch.tensor(own, dtype=torch.float64),
                        hash_values.reshape(-1).view(torch.float64)])
    gathered = _gather(packed, group, world, device)
    n_stats = stats.numel()
    per_tensor = gathered[:, :n_stats].reshape(world, len(tensors), _PER_TENSOR)
    per_rank = gathered[:, n_stats:n_stats + _PER_RANK]
    all_hashes = gathered[:, n_stats + _PER_RANK:].contiguous().view(torch.int64).reshape(world, len(tensors), 2)
    record = _record(tensors, per_tensor, per_rank, all_hashes, replication, step, world,
                     str(dist.get_backend(group)) if initialised else "none", note)
    return record, rank, world


def _record(tensors: list[tuple[str, str, torch.Tensor]], per_tensor: torch.Tensor, per_rank: torch.Tensor,
            hashes: torch.Tensor, replication: list[float], step: int, world: int, backend: str,
            note: str) -> dict[str, Any]:
    pt = per_tensor.tolist()    # [rank][tensor][stat]
    hs = hashes.tolist()        # [rank][tensor][2]
    ranks_ = range(world)
    rows = []
    total_sq = 0.0
    global_nonfinite = 0
    for i, (name, kind, t) in enumerate(tensors):
        sq = [pt[r][i][0] for r in ranks_]
        nan = [int(pt[r][i][1]) for r in ranks_]
        inf = [int(pt[r][i][2]) for r in ranks_]
        has_grad = any(pt[r][i][4] > 0 for r in ranks_)
        factor = replication[i]
        if not has_grad or factor == 0.0:
            gsq = math.nan
        elif math.isnan(factor):
            gsq = sq[0]
        else:
            gsq = sum(sq) / factor
        if has_grad:  # a NaN gradient makes the total NaN, as in clip_grad_norm_; so does a Partial one
            total_sq += gsq
        global_nonfinite += sum(nan) + sum(inf)
        dtensor = is_dtensor(t)
        rows.append({
            "name": name, "kind": kind, "placements": placements_text(t) if dtensor else "",
            "mesh": list(t.device_mesh.shape) if is_dtensor(t) else [],
            "shape": list(t.shape), "numel": t.numel(), "dtype": str(t.dtype).removeprefix("torch."),
            "requires_grad": bool(t.requires_grad) if kind == "parameter" else False, "has_grad": has_grad,
            "local_numel": [int(pt[r][i][3]) for r in ranks_],
            "grad_norm": math.sqrt(gsq) if has_grad and gsq >= 0 else None,
            "local_grad_norm": [math.sqrt(v) if has_grad and v >= 0 else None for v in sq],
            "nan": nan, "inf": inf,
            "replica_key": [int(pt[r][i][5]) for r in ranks_],
            "hash": [hs[r][i] for r in ranks_],
        })
    is_param = [k == "parameter" for _, k, _ in tensors]
    ranks = []
    for r in ranks_:
        stats = pt[r]
        sq = sum(row[0] for row, p in zip(stats, is_param) if p)
        pb, gb, bb, alloc, peak, rss, peak_rss = per_rank[r].tolist()
        ranks.append({
            "rank": r,
            "grad_norm": math.sqrt(sq) if any(is_param) and sq >= 0 else None,
            "nonfinite": int(sum(row[1] + row[2] for row in stats)),
            "param_numel": int(sum(row[3] for row, p in zip(stats, is_param) if p)),
            "param_bytes": int(pb), "grad_bytes": int(gb), "buffer_bytes": int(bb),
            "device_allocated": None if math.isnan(alloc) else int(alloc),
            "device_peak": None if math.isnan(peak) else int(peak),
            "rss": None if math.isnan(rss) else int(rss), "peak_rss": int(peak_rss),
        })
    return {
        "format": FORMAT, "version": VERSION, "step": int(step), "time": time.time(),
        "world_size": world, "backend": backend, "note": note,
        "global": {"grad_norm": math.sqrt(total_sq), "nonfinite": global_nonfinite,
                   "param_numel": sum(r["numel"] for r in rows if r["kind"] == "parameter")},
        "ranks": ranks, "tensors": rows,
    }


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line to ``path`` (its folder is made if missing)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(_finite(record), allow_nan=False, default=str, separators=(",", ":"))
    with open(p, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def _finite(value: Any) -> Any:
    """NaN and Inf become null: JSON has no spelling for them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
