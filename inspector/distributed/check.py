"""``check_step``: one call per training step, on every rank, that finds the silent multi-GPU bugs.

Each rank reduces its own tensors to a few numbers per tensor (local gradient sum of squares,
NaN and Inf counts of the gradient and of the values, the local element count and one
position-dependent hash of part of the local values, see :mod:`.digest`); one ``all_gather``
of those numbers (O(number of tensors), never the tensors) gives every rank the same
picture, so every rank returns the same findings. Before it, the ranks agree on a small
fingerprint through the store, with a timeout (:mod:`.sync`): a rank that skipped a call is
named instead of a hang. Rank 0 appends the step as one row to the Arrow run file the watch
writes too (its ``check`` column), which ``read_run``, ``report`` and the Training page read.

Cost: what does not change between steps (names, placements, replica keys, the slices each
call reads) is worked out once per model and kept while the model's tensors stay the same
objects (:mod:`.plan`). Per step, the numbers stay columns, one tensor per quantity for all
tensors (:mod:`.local`): one fused norm pass over the local gradients (none when ``grad_norms=``
gives the norms the step already took), one concatenated pass over the values read this call
(NaN/Inf and hash), one small gather, and findings tested over all tensors at once
(:mod:`.columns`): a tensor's JSON row is built only where a test fires, the record only when
it is written or read. The values read are every tensor of up to :data:`~.digest.WHOLE`
elements and one of :data:`~.digest.PARTS` windows of the larger ones: a value that differs
between replicas is found within ``PARTS`` calls (at once in the small tensors). Parameter
values are read whole when a gradient is not finite, to name where it started.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..runfiles import append_check
from ..runfiles.record import FORMAT, PER_RANK, PER_TENSOR, VERSION
from ..sharding.findings import ranks_of
from ..utils.findings import Finding
from ..utils.process_memory import rss_and_peak as _rss
from .columns import Gathered, column_findings
from .local import GradNorms, local_numbers
from .plan import plan_for
from .sync import agree, next_call

__all__ = ["FORMAT", "VERSION", "StepCheck", "check_step", "collect"]

TIMEOUT = 300.0  # seconds a rank waits for the others to reach the same check_step call


@dataclass(frozen=True)
class StepCheck:
    """What ``check_step`` found at one step; the same on every rank.

    ``record`` is the JSON-ready dict rank 0 wrote (see :func:`check_step`); ``source`` is that
    dict or a function that builds it, called on first use of ``record`` (most steps never
    need the per-tensor rows).
    """

    step: int
    rank: int
    world_size: int
    source: dict[str, Any] | Callable[[], dict[str, Any]] = field(repr=False)
    findings: list[Finding] = field(default_factory=list)

    @cached_property
    def record(self) -> dict[str, Any]:
        """The JSON-ready step record, with its findings."""
        return self.source() if callable(self.source) else self.source

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with the record built (a builder function does not pickle)."""
        return type(self), (self.step, self.rank, self.world_size, self.record, self.findings)

    @property
    def ok(self) -> bool:
        """No error and no warning."""
        return not any(f.severity in ("error", "warning") for f in self.findings)


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


def _gather(tensor: torch.Tensor, group: Any, world: int, device: torch.device) -> torch.Tensor:
    if world == 1:
        return tensor.unsqueeze(0)
    moved = tensor.to(device)
    out = [torch.empty_like(moved) for _ in range(world)]
    dist.all_gather(out, moved, group=group)
    return torch.stack(out).cpu()



def check_step(model: nn.Module, step: int,
               path: str | os.PathLike | None = "inspector-distributed.inspect", *, group: Any = None,
               note: str = "", far_factor: float = 10.0, loss: Any = None,
               timeout: float = TIMEOUT, grad_norms: GradNorms | None = None) -> StepCheck:
    """Compare every rank's gradients, replicas, values and memory at one training step.

    Call it on every rank after ``loss.backward()`` (before ``optimizer.zero_grad()``), every
    step or every N steps, at the same steps on every rank; it reads the model and changes
    nothing. Without an initialised process group it checks this one process.

    Args:
        model: the model of this rank (FSDP2, tensor-parallel, 2-D meshes, DDP or plain).
        step: the training step number, written to the record.
        path: the run file rank 0 appends the step to (the Arrow run file :func:`inspector.watch`
            writes, one row per step, each finding with the ranks it is about;
            :func:`inspector.read_run` reads it); None writes nothing.
        group: the process group to compare over (default: every rank).
        note: free text stored with the record (a run name, a learning rate...).
        far_factor: a rank whose gradient RMS per element is this many times above or below
            the other ranks' median is reported.
        loss: this rank's loss (a tensor or number), to name the rank whose loss went
            non-finite first when NaN has spread to every rank through the gradient reduction.
        timeout: seconds to wait for the other ranks to reach the same call before raising.
        grad_norms: ``(names, norms)``, the norms of this rank's local gradient pieces already
            taken this step (``norms[k]`` for the parameter ``names[k]`` of ``named_parameters()``,
            0 where it has no gradient), so the gradients are not read again; a parameter with a
            gradient that ``names`` leaves out is measured here.

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
    return checked_step(model, step, path, group=group, note=note, far_factor=far_factor, loss=loss,
                        timeout=timeout, grad_norms=grad_norms)


def checked_step(model: nn.Module, step: int, path: str | os.PathLike | None, *, group: Any = None,
                 note: str = "", far_factor: float = 10.0, loss: Any = None, timeout: float = TIMEOUT,
                 grad_norms: GradNorms | None = None, agreed: bool = False) -> StepCheck:
    """:func:`check_step`; ``agreed``: every rank is known to be at this step already (the watch's ranks
    checked in just before), so the store round trips that make sure of it are skipped."""
    gathered, rank, world = gather_step(model, step, group=group, note=note, loss=loss, timeout=timeout,
                                        grad_norms=grad_norms, agreed=agreed)
    findings = column_findings(gathered, far_factor)

    def record() -> dict[str, Any]:
        return replace(gathered.check(), findings=findings).to_json()

    result = StepCheck(step, rank, world, record, findings)
    if rank == 0 and path is not None:
        append_check(path, result.record, [list(ranks_of(f)) for f in findings])
    return result


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
    gathered, rank, world = gather_step(model, step, group=group, note=note, hashes=hashes, loss=loss,
                                        timeout=timeout)
    return gathered.record(), rank, world


def gather_step(model: nn.Module, step: int = 0, *, group: Any = None, note: str = "", hashes: bool = True,
                loss: Any = None, timeout: float = TIMEOUT, grad_norms: GradNorms | None = None,
                agreed: bool = False) -> tuple[Gathered, int, int]:
    """Every rank's numbers as columns (one all_gather), and this rank and the world size."""
    local = local_step(model, step, group=group, note=note, hashes=hashes, loss=loss, timeout=timeout,
                       grad_norms=grad_norms, agreed=agreed)
    device = _collective_device(group) if local.world > 1 else torch.device("cpu")
    return local.gathered(_gather(local.packed, group, local.world, device)), local.rank, local.world


@dataclass
class LocalStep:
    """This rank's numbers of one check, packed into one float64 vector for the ``all_gather``
    (:meth:`gathered` reads every rank's), so a caller can send them with its own numbers."""

    plan: Any
    packed: torch.Tensor
    factors: torch.Tensor
    step: int
    rank: int
    world: int
    backend: str
    note: str

    def gathered(self, rows: torch.Tensor) -> Gathered:
        """The check's columns from the (world, len(packed)) float64 rows every rank sent."""
        n = len(self.plan.tensors)
        n_stats = n * PER_TENSOR
        per_tensor = rows[:, :n_stats].reshape(self.world, n, PER_TENSOR)
        per_rank = rows[:, n_stats:n_stats + PER_RANK]
        hashes = rows[:, n_stats + PER_RANK:].contiguous().view(torch.int64).reshape(self.world, n, 2)
        return Gathered(self.plan, per_tensor, per_rank, hashes, self.factors, self.step, self.world,
                        self.backend, self.note)


def local_step(model: nn.Module, step: int = 0, *, group: Any = None, note: str = "", hashes: bool = True,
               loss: Any = None, timeout: float = TIMEOUT, grad_norms: GradNorms | None = None,
               agreed: bool = False, grads: Sequence[torch.Tensor | None] | None = None) -> LocalStep:
    """This rank's part of :func:`gather_step`, up to the ``all_gather`` (the ranks agree first, unless
    ``agreed``); ``grads``: the ``.grad`` of each parameter ``grad_norms`` names, as just read."""
    initialised = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size(group) if initialised else 1
    rank = dist.get_rank(group) if initialised else 0
    plan = plan_for(model, world)
    call = next_call(group)
    if initialised and not agreed:
        agree(group, rank, world, {"step": int(step), "call": call, "tensors": len(plan.tensors)}, timeout)
    stats, hash_values, factors = local_numbers(plan, call, hashes, grad_norms, grads)
    sizes = stats[:, 3] * plan.columns["element_size"]
    is_param = plan.columns["is_param"]
    param_bytes = float(sizes[is_param].sum())
    grad_bytes = float(sizes[is_param & (stats[:, 4] > 0)].sum())
    buffer_bytes = float(sizes.sum()) - param_bytes
    first = plan.tensors[0][2] if plan.tensors else None
    own = [param_bytes, grad_bytes, buffer_bytes] + \
        _memory(first.device if first is not None else torch.device("cpu")) + _loss_value(loss)
    # one all_gather: the int64 hashes travel as float64 bit patterns (copied, never computed on)
    packed = torch.cat([stats.reshape(-1), torch.tensor(own, dtype=torch.float64),
                        hash_values.reshape(-1).view(torch.float64)])
    return LocalStep(plan, packed, factors, int(step), rank, world,
                     str(dist.get_backend(group)) if initialised else "none", note)
