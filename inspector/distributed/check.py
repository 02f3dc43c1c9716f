"""``check_step``: one call per training step, on every rank, that finds the silent multi-GPU bugs.

Each rank reduces its own tensors to a few numbers per tensor (local gradient sum of squares,
NaN and Inf counts of the gradient and of the values, the local element count and one
position-dependent hash of part of the local values, see :mod:`.digest`); one ``all_gather``
of those numbers (O(number of tensors), never the tensors) gives every rank the same
picture, so every rank returns the same findings. Before it, the ranks agree on a small
fingerprint through the store, with a timeout (:mod:`.sync`): a rank that skipped a call is
named instead of a hang. Rank 0 appends the step as one JSON line to a file that
``read_run``, ``report`` and the Distributed page read.

Cost: what does not change between steps (names, placements, replica keys) is worked out once
per model and kept while the model's tensors stay the same objects; per step, one fused norm
pass over the local gradients, one over a 1/``PARTS`` part of the local values (hash and
NaN/Inf), and one small gather. A value that differs between replicas is found within
:data:`~.digest.PARTS` calls (at once in tensors of up to :data:`~.digest.WHOLE` elements).
Parameter values are read whole when a gradient is not finite, to name where it started.
"""

from __future__ import annotations

import math
import os
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..findings import Finding
from ..process_memory import rss_and_peak as _rss
from ..wrappers import underlying
from . import digest
from .findings import step_findings
from .record import FORMAT, PER_RANK, PER_TENSOR, VERSION, append_record, build_record
from .sync import agree, next_call
from .tensors import holders, is_dtensor, placements_text, replica_key

__all__ = ["FORMAT", "VERSION", "StepCheck", "append_record", "check_step", "collect"]

TIMEOUT = 300.0  # seconds a rank waits for the others to reach the same check_step call


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


def _registries(module: nn.Module) -> tuple[dict, dict, dict]:
    return module._modules, module._parameters, module._buffers


def _unique(model: nn.Module) -> list[tuple[str, str, torch.Tensor]]:
    """Each parameter then buffer once, under its first name."""
    seen: set[int] = set()
    out = []
    for kind, items in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, t in items:
            if id(t) not in seen:
                seen.add(id(t))
                out.append((name, kind, t))
    return out


def _held(modules: list[weakref.ref]) -> list[int] | None:
    """Ids of everything the modules' registries hold, in order (with their sizes); None when a
    module is gone."""
    out: list[int] = []
    for ref in modules:
        module = ref()
        if module is None:
            return None
        for reg in _registries(module):
            out.append(len(reg))
            out.extend(map(id, reg.values()))
    return out


@dataclass
class _Plan:
    """What does not change between steps, for one model and world size."""

    modules: list[weakref.ref]   # weakly: a plan must not keep a model alive
    held: list[int] | None       # sizes and ids of what their registries held
    world: int
    tensors: list[tuple[str, str, torch.Tensor]]
    dtensor: list[bool]
    keys: list[int]
    holders: list[float]
    static: list[dict[str, Any]]
    resync: str
    is_param: list[bool]
    sizes: list[int]          # element sizes
    flats: list[torch.Tensor | None] = field(default_factory=list)   # 1-D views of the local pieces
    pointers: list[int] = field(default_factory=list)                # their data pointers when made
    lengths: list[int] = field(default_factory=list)                 # their element counts

    def valid(self, world: int, resync: str) -> bool:
        """Whether the model still holds the same modules, parameters and buffers."""
        return (self.world, self.resync) == (world, resync) and _held(self.modules) == self.held

    def local_flats(self, pieces: list[torch.Tensor]) -> list[torch.Tensor | None]:
        """1-D views of ``pieces``, remade when a piece's storage changed (``p.data = ...``)."""
        pointers = [p.data_ptr() if p.layout == torch.strided else 0 for p in pieces]
        if pointers != self.pointers:
            self.flats = [digest.flat(p) if p.layout == torch.strided else None for p in pieces]
            self.pointers = pointers
            self.lengths = [f.numel() if f is not None else 0 for f in self.flats]
        return self.flats


_plans: weakref.WeakKeyDictionary[nn.Module, _Plan] = weakref.WeakKeyDictionary()


def _resync(model: nn.Module) -> str:
    """What the wrapper copies from rank 0 to every rank before each forward pass."""
    if type(model).__name__ == "DistributedDataParallel" and getattr(model, "broadcast_buffers", False):
        return "buffers"
    return ""


def _plan(model: nn.Module, world: int) -> _Plan:
    inner = underlying(model)  # DDP / torch.compile: the names the user wrote
    resync = _resync(model)
    cached = _plans.get(inner)
    if cached is not None and cached.valid(world, resync):
        return cached
    tensors = _unique(inner)
    modules = [weakref.ref(m) for m in inner.modules()]
    static = [{
        "name": name, "kind": kind, "placements": placements_text(t),
        "mesh": list(t.device_mesh.shape) if is_dtensor(t) else [],
        "shape": list(t.shape), "numel": t.numel(), "dtype": str(t.dtype).removeprefix("torch."),
        "requires_grad": False, "resync": resync if kind == "buffer" else "",
    } for name, kind, t in tensors]
    plan = _Plan(modules, _held(modules), world, tensors,
                 [is_dtensor(t) for _, _, t in tensors], [replica_key(t, world) for _, _, t in tensors],
                 [holders(t, world) for _, _, t in tensors], static, resync,
                 [k == "parameter" for _, k, _ in tensors], [t.element_size() for _, _, t in tensors])
    _plans[inner] = plan
    return plan


def _memory(device: torch.device) -> list[float]:
    alloc = peak = math.nan
    if device.type == "cuda":
        alloc = float(torch.cuda.memory_allocated(device))
        peak = float(torch.cuda.max_memory_allocated(device))
    rss, peak_rss = _rss()
    return [alloc, peak, rss, peak_rss]


def _collective_device(group: Any) -> torch.device:
    backend = dist.get_backend(group)
    if "nccl" in str(backend).lower() and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _grad_squares(grads: dict[int, torch.Tensor], stats: list[list[float]]) -> None:
    """Local squared norms (one fused pass per device and dtype); NaN/Inf counts where not finite."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, g in grads.items():
        groups.setdefault((g.device, g.dtype), []).append(i)
    for idx in groups.values():
        values = torch.stack(torch._foreach_norm([grads[i] for i in idx])).double().cpu()
        for i, v in zip(idx, values.tolist(), strict=True):
            stats[i][0] = v * v
            if not math.isfinite(v):
                g = grads[i]
                stats[i][1] = int(torch.isnan(g).sum())
                stats[i][2] = int(torch.isinf(g).sum())
                if stats[i][1] == 0 and stats[i][2] == 0:  # finite values whose norm overflowed
                    stats[i][0] = float(torch.linalg.vector_norm(g.double())) ** 2


def _local_numbers(plan: _Plan, call: int, with_hashes: bool) -> tuple[torch.Tensor, torch.Tensor, list[float]]:
    """Per-tensor stats (float64) and hashes (int64, with the part read) of this rank, and the
    number of ranks holding each gradient element."""
    stats = [[0.0] * PER_TENSOR for _ in plan.tensors]
    pieces = [t._local_tensor if dt else t  # type: ignore[attr-defined]
              for (_, _, t), dt in zip(plan.tensors, plan.dtensor, strict=True)]
    grads: dict[int, torch.Tensor] = {}
    factors = list(plan.holders)
    for i, ((_, kind, t), piece) in enumerate(zip(plan.tensors, pieces, strict=True)):
        row = stats[i]
        row[3] = piece.numel()
        row[5] = plan.keys[i]
        g = t.grad if kind == "parameter" else None
        if g is None:
            continue
        row[4] = 1
        if plan.dtensor[i]:
            if g.placements != t.placements:  # type: ignore[attr-defined]
                factors[i] = holders(g, plan.world)
            g = g._local_tensor  # type: ignore[attr-defined]
        if g.layout == torch.strided and g.numel():
            grads[i] = g
    _grad_squares(grads, stats)
    flats = plan.local_flats(pieces)
    ranges = [digest.part(n, call) for n in plan.lengths]
    parts = [f[a:b] if f is not None else None for f, (a, b) in zip(flats, ranges, strict=True)]
    full = any(stats[i][1] or stats[i][2] for i in grads)  # non-finite gradients: read every value
    checked: list[tuple[int, torch.Tensor]] = []
    for i, (f, p) in enumerate(zip(flats, parts, strict=True)):
        if f is not None and p is not None:
            checked.append((i, f if full else p))
    for (i, _), (nan, inf) in zip(checked, digest.nonfinite_counts([v for _, v in checked]), strict=True):
        stats[i][6], stats[i][7] = nan, inf
    hash_tensor = torch.zeros(len(pieces), 2, dtype=torch.int64)
    if with_hashes:
        by_device: dict[torch.device, list[int]] = {}
        for i, p in enumerate(parts):
            if p is not None and plan.keys[i] >= 0 and ranges[i][1] > ranges[i][0]:  # another rank must equal it
                by_device.setdefault(p.device, []).append(i)
        for idx in by_device.values():  # one device-to-host copy per device
            hash_tensor[idx, 0] = digest.hashes([(parts[i], ranges[i][0]) for i in idx]).cpu()  # type: ignore[misc]
            hash_tensor[idx, 1] = torch.tensor([-1 if plan.lengths[i] <= digest.WHOLE else call % digest.PARTS
                                                for i in idx])
    return torch.tensor(stats, dtype=torch.float64).reshape(len(pieces), PER_TENSOR), hash_tensor, factors


def _gather(tensor: torch.Tensor, group: Any, world: int, device: torch.device) -> torch.Tensor:
    if world == 1:
        return tensor.unsqueeze(0)
    moved = tensor.to(device)
    out = [torch.empty_like(moved) for _ in range(world)]
    dist.all_gather(out, moved, group=group)
    return torch.stack(out).cpu()


def check_step(model: nn.Module, step: int, path: str | os.PathLike | None = "inspector-distributed.jsonl", *,
               group: Any = None, note: str = "", far_factor: float = 10.0, loss: Any = None,
               timeout: float = TIMEOUT) -> StepCheck:
    """Compare every rank's gradients, replicas, values and memory at one training step.

    Call it on every rank after ``loss.backward()`` (before ``optimizer.zero_grad()``), every
    step or every N steps, at the same steps on every rank; it reads the model and changes
    nothing. Without an initialised process group it checks this one process.

    Args:
        model: the model of this rank (FSDP2, tensor-parallel, 2-D meshes, DDP or plain).
        step: the training step number, written to the record.
        path: JSON-lines file rank 0 appends one line to; None writes nothing.
        group: the process group to compare over (default: every rank).
        note: free text stored with the record (a run name, a learning rate...).
        far_factor: a rank whose gradient RMS per element is this many times above or below
            the other ranks' median is reported.
        loss: this rank's loss (a tensor or number), to name the rank whose loss went
            non-finite first when NaN has spread to every rank through the gradient reduction.
        timeout: seconds to wait for the other ranks to reach the same call before raising.

    Returns:
        :class:`StepCheck` with the record and the findings: ``replica-drift`` (a replicated
        parameter or buffer differs; names the tensor and the ranks), ``replica-resynchronised``
        (a buffer that differs but the wrapper copies from rank 0 before the next forward pass),
        ``nonfinite-parameter`` and ``nonfinite-gradient`` (by rank and tensor, with where it
        started), ``gradient-not-synchronized``, ``gradient-far-off``, ``shard-imbalance``.

    Raises:
        InspectorError: another rank did not reach this call within ``timeout`` seconds or is at
            another step (the message names it); no collective was started.

    >>> m = nn.Linear(2, 1)
    >>> m(torch.ones(1, 2)).sum().backward()
    >>> check_step(m, 0, path=None).record["global"]["grad_norm"] > 0
    True
    """
    record, rank, world = collect(model, step, group=group, note=note, loss=loss, timeout=timeout)
    findings = step_findings(record, far_factor=far_factor)
    record["findings"] = [f.to_dict() for f in findings]
    if rank == 0 and path is not None:
        append_record(path, record)
    return StepCheck(step, rank, world, record, findings)


def _loss_value(loss: Any) -> list[float]:
    if loss is None:
        return [math.nan, 0.0]
    value = loss.detach().float().mean() if isinstance(loss, torch.Tensor) else loss
    return [float(value), 1.0]


def collect(model: nn.Module, step: int = 0, *, group: Any = None, note: str = "", hashes: bool = True,
            loss: Any = None, timeout: float = TIMEOUT) -> tuple[dict[str, Any], int, int]:
    """The step record without findings, and this rank and the world size (one all_gather).

    Every rank of ``group`` must call it at the same time (it is a collective).
    """
    initialised = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size(group) if initialised else 1
    rank = dist.get_rank(group) if initialised else 0
    plan = _plan(model, world)
    call = next_call(group)
    if initialised:
        agree(group, rank, world, {"step": int(step), "call": call, "tensors": len(plan.tensors)}, timeout)
    device = _collective_device(group) if initialised else torch.device("cpu")
    stats, hash_values, factors = _local_numbers(plan, call, hashes)
    numel = stats[:, 3].tolist()
    sizes = [n * e for n, e in zip(numel, plan.sizes, strict=True)]
    grad_bytes = sum(b for b, (_, k, t) in zip(sizes, plan.tensors, strict=True) if k == "parameter" and t.grad is not None)
    param_bytes = sum(b for b, p in zip(sizes, plan.is_param, strict=True) if p)
    buffer_bytes = sum(sizes) - param_bytes
    first = next((t for _, _, t in plan.tensors), None)
    own = [float(param_bytes), float(grad_bytes), float(buffer_bytes)] + \
        _memory(first.device if first is not None else torch.device("cpu")) + _loss_value(loss)
    # one all_gather: the int64 hashes travel as float64 bit patterns (copied, never computed on)
    packed = torch.cat([stats.reshape(-1), torch.tensor(own, dtype=torch.float64),
                        hash_values.reshape(-1).view(torch.float64)])
    gathered = _gather(packed, group, world, device)
    n_stats = stats.numel()
    per_tensor = gathered[:, :n_stats].reshape(world, len(plan.tensors), PER_TENSOR)
    per_rank = gathered[:, n_stats:n_stats + PER_RANK]
    all_hashes = gathered[:, n_stats + PER_RANK:].contiguous().view(torch.int64).reshape(world, len(plan.tensors), 2)
    static = [{**s, "requires_grad": bool(t.requires_grad) if k == "parameter" else False}
              for s, (_, k, t) in zip(plan.static, plan.tensors, strict=True)]
    record = build_record(static, factors, per_tensor, per_rank, all_hashes, step, world,
                          str(dist.get_backend(group)) if initialised else "none", note)
    return record, rank, world
