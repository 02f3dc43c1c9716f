"""``watch``: one context manager around a training loop that records every step."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..aliases import compare_ties, snapshot_ties
from ..capture import Captures
from ..replaying import StepKeeper
from ..runfiles import RunMeta, RunWriter, StepFinding
from ..sharding.findings import ranks_of
from ..utils.codes import recurs
from ..utils.dtensors import is_dtensor
from ..utils.findings import Episodes, Finding, InspectorError, group_findings
from ..utils.wrappers import underlying
from .checks import (
    GradientClearing,
    Optimizers,
    OptimizerSteps,
    Progress,
    TrainingMode,
    failure_finding,
    frozen_findings,
    nonfinite_gradients,
    optimizer_list,
    replaced_findings,
)
from .detect import Detectors, not_in_optimizer
from .layout import Layout, current, fused_norms, refresh, to_host
from .numbers import Numbers
from .producer import producer_at_forward_end
from .ranks import ComputeClock, Meeting, RanksApart, gather_numbers, merge_findings, slow_ranks
from .result import WatchResult
from .rows import step_record
from .steps import StepState, nonfinite_findings, transfer_step, written_findings
from .tracer import NonfiniteTracer

_PRODUCED = ("nonfinite-forward", "nonfinite-backward")
_SPREAD = ("nonfinite-gradient", "nonfinite-parameter")


class Watch:
    """The object ``with watch(...) as w`` gives: :meth:`log`, :meth:`step`, ``findings`` so far."""

    def __init__(self, model: nn.Module, optimizer: Optimizers, path: str | os.PathLike, *,
                 every: int = 1, nonfinite: bool = False, update_ratio: bool = False, scaler: Any = None,
                 window: int = 5, explode_factor: float = 8.0, loss_factor: float = 3.0,
                 recur_after: int = 5, capture_bytes: int = 64 << 20,
                 group: Any = None, distributed: bool | None = None, name: str = "", note: str = "",
                 timeout: float = 300.0, on_finding: Callable[[StepFinding], None] | None = None,
                 keep: bool | int = False, keep_weights: bool = False, keep_bytes: int = 1 << 30) -> None:
        if not isinstance(model, nn.Module):
            raise InspectorError(f"watch needs an nn.Module, got {type(model).__name__}")
        self.optimizers = optimizer_list(optimizer)
        optimizer = self.optimizers[0] if self.optimizers else None
        if every < 1:
            raise InspectorError(f"every must be 1 or more, got {every}")
        self.model, self.optimizer, self.path = model, optimizer, str(path)
        self.root = underlying(model)
        self.every, self.update_ratio, self.scaler = every, update_ratio, scaler
        self.capture_bytes = capture_bytes if nonfinite else 0
        self.on_finding = on_finding
        self.layout = Layout.of(self.root)
        self.sharded = any(is_dtensor(p) for p in self.root.parameters())  # FSDP2 / tensor parallel
        self.module_names = [n for n, _ in self.root.named_modules()]
        initialised = dist.is_available() and dist.is_initialized()
        self.group = group
        self.world = dist.get_world_size(group) if initialised else 1
        self.rank = dist.get_rank(group) if initialised else 0
        self.distributed = self.world > 1 if distributed is None else distributed
        self.meta = RunMeta(name or type(self.root).__name__, self.world, every, self.layout.modules,
                            self.layout.parameters, tuple(int(i) for i in self.layout.owner),
                            tuple(c for c, on in (("nonfinite", nonfinite), ("update_ratio", update_ratio),
                                                  ("distributed", self.distributed)) if on),
                            update_ratio, time.time(), note)
        # this rank's own checks, on its own numbers (the other ranks' findings arrive at the gather)
        self.detectors = Detectors(self.layout, window=window, explode_factor=explode_factor,
                                   loss_factor=loss_factor)
        self.state = StepState()
        self.tracer: NonfiniteTracer | None = None
        self._nonfinite = nonfinite
        self._handles: list[RemovableHandle] = []
        self._writer: RunWriter | None = None
        # each finding once per (code, where, rank), or once per episode (codes.recurs); a code checked
        # only every Nth step has not cleared before N steps pass without it
        self._episodes = Episodes(recurs, max(recur_after, every))
        self.findings: list[StepFinding] = []
        self.captures: Captures | None = None
        self.result: WatchResult | None = None
        self._scalars: dict[str, Any] = {}
        self.clearing = GradientClearing()
        self.modes = TrainingMode(self.root)
        self.progress = Progress(self.layout.parameters)
        self.timeout = timeout
        self.meeting: Meeting | None = None
        self.forwards = 0  # training forward passes (grad on, train mode): every rank makes as many
        self.clock = ComputeClock(self.sharded)
        self._check_found: list[Finding] = []
        # a stop asked by this rank (or, with stop_on_error, an error finding of its own) goes out with its
        # numbers; every rank reads the same gathered flags at the same step boundary (stop_agreed)
        self.stop_requested = False
        self.stop_on_error = False
        self.stop_agreed = False
        self.others: OptimizerSteps | None = None
        self._pre_done = False
        self._held_mask: np.ndarray | None = None
        self.keeper = StepKeeper(  # the last steps, kept for inspector.replay (docs/replay.md)
            self.root, path, steps=keep if type(keep) is int and keep else 2, keep_weights=keep_weights,
            max_bytes=keep_bytes, rank=self.rank, world=self.world, model=self.meta.model,
            explode_factor=explode_factor) if keep or keep_weights else None

    # -- the user's calls ------------------------------------------------------------------
    def log(self, **scalars: Any) -> None:
        """Record scalars (floats or 0-d tensors, kept on their device) with the current step."""
        for k, v in scalars.items():
            if isinstance(v, torch.Tensor):
                if v.numel() != 1:
                    raise InspectorError(f"w.log({k}=...) takes a number or a one-element tensor, got shape "
                                         f"{tuple(v.shape)}")
                v = v.detach().reshape(())
            elif not isinstance(v, (int, float)):
                raise InspectorError(f"w.log({k}=...) takes a number or a tensor, got {type(v).__name__}")
            self._scalars[k] = v

    def step(self) -> None:
        """Mark the end of a step (only for loops without an optimizer passed to ``watch``)."""
        if self.optimizer is not None:
            raise InspectorError("with an optimizer, each optimizer.step() is a step; w.step() is for loops "
                                 "without one")
        self._pre_step()
        self._post_step()

    @property
    def steps(self) -> int:
        return self.state.count

    # -- hooks -------------------------------------------------------------------------------
    def open(self) -> None:
        held = self._held()
        self.ties = snapshot_ties(self.root)
        self.alias_names = tuple(n for n, _ in self.root.named_parameters(remove_duplicate=False))
        self.tie_ids = self._tie_ids()
        if self.rank == 0:
            self._writer = RunWriter(self.path, self.meta)
        self.meeting = Meeting(self.group, self.rank, self.world, self.timeout) if self.world > 1 else None
        if self._nonfinite:
            from ..runfiles.captured import remove_captures

            remove_captures(self.path, self.rank, self.world)
        self._handles.append(self.root.register_forward_hook(self._forwarded, with_kwargs=True))
        if self.keeper is not None:
            self._handles += self.keeper.attach()
        if self.world > 1:  # each rank's own time before the step's first collective (slow-rank)
            self._handles += self.clock.attach(self.model, self.root)
        if self._nonfinite:
            self.tracer = NonfiniteTracer(self.root, backward=True, keep=self.capture_bytes > 0)
            self._handles.append(self.root.register_forward_hook(self._forward_end))
        if self.optimizer is not None:
            self._handles.append(self.optimizer.register_step_pre_hook(self._step_starts))
            self._handles.append(self.optimizer.register_step_post_hook(lambda *a: self._post_step()))
            self.others = OptimizerSteps(self.optimizers, [self._names_of(o) for o in self.optimizers])
        params = current(self.root, self.layout.parameters)
        self.clearing.attach(params)
        if not self.sharded:  # the norms before any step (a sharded one's are global only once stepped)
            start = np.full(len(params), np.nan)
            for idx, part in fused_norms(params):
                start[idx] = to_host([part])[0]
            self.progress = Progress(self.layout.parameters, start=start)
        self.state.start = time.perf_counter()
        self._pending = frozen_findings(self.root)
        if self.optimizer is not None:
            self._pending += not_in_optimizer(self.layout.parameters, params, held)

    def close(self, completed: bool, error: BaseException | None = None) -> WatchResult:
        """Remove every hook, close the file and freeze the result (safe after a failed open). An
        ``error`` that ended the block is recorded as a ``run-failed`` finding at the step it was in."""
        if self.meeting is not None:  # the other ranks learn how this one ended; rank 0 records theirs
            self.meeting.ended(self.state.count, None if isinstance(error, RanksApart) else error)
            skip = set(error.ranks) if isinstance(error, RanksApart) else set()
            for r, f in self.meeting.failures(self.state.count, error).items():
                if r not in skip:
                    self._failed(f, r)
        if error is not None and not isinstance(getattr(error, "finding", None), StepFinding):
            self._failed(failure_finding(error, self.state.count), self.rank)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self.clearing.remove()
        if self.others is not None:
            self.others.remove()
        if self.tracer is not None:
            self.tracer.remove()
        if self._writer is not None:
            self._writer.close()
        if self.keeper is not None:
            self.keeper.close()
        self.result = WatchResult(self.path, self.state.count, list(self.findings), self.captures, completed)
        return self.result

    def _failed(self, f: Finding, rank: int) -> None:
        """Record ``run-failed`` (or a rank's) at the current step, on ``rank``'s row of no step."""
        new = self._first_time([f], self.state.count, rank)
        if self._writer is not None and new:
            n = Numbers(len(self.layout.modules), len(self.layout.parameters), len(self.layout.buffers))
            try:
                self._writer.write([step_record(self.state.count, rank, n, {}, self._lrs(), new)])
            except Exception:  # noqa: BLE001 - the run's own error is the one to raise
                pass

    def _held(self, optimizers: list[torch.optim.Optimizer] | None = None) -> set[int]:
        return {id(p) for o in (self.optimizers if optimizers is None else optimizers)
                for g in o.param_groups for p in g["params"]}

    def _names_of(self, optimizer: torch.optim.Optimizer) -> list[str]:
        held = {id(p) for g in optimizer.param_groups for p in g["params"]}
        return [n for n, p in self.root.named_parameters() if id(p) in held]

    def _tie_ids(self) -> tuple[int, ...]:
        """The object behind every parameter name, aliases included (read from the owners' registries)."""
        return tuple(id(p) for p in current(self.root, self.alias_names))

    def _forwarded(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if module.training and torch.is_grad_enabled():  # a training forward: its batch as the model took it
            self.forwards += 1
            if self.tracer is None:  # the tracer sees the batch itself
                self.state.see_batch(args, kwargs)

    def _forward_end(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.tracer is not None and self.captures is None:
            self.captures = producer_at_forward_end(self.tracer, self.module_names[0], self.capture_bytes,
                                                    self.state.count, self.rank, self.path, self.world)

    # -- one step ----------------------------------------------------------------------------
    def _step_starts(self, optimizer: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """The optimizer's pre-step hook. A step given a closure (Lightning, LBFGS) computes its
        gradients inside it: the step's numbers are taken when the closure first returns."""
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args[0]: the optimizer
        if closure is None:
            if not self._pre_done:  # else taken already (gradients_ready, before a clip)
                self._pre_step()
            return None

        def closure_then_measure() -> Any:
            out = closure()
            if not self._pre_done:
                with torch.no_grad():
                    self._pre_step()
            return out
        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_measure}
        return (args[0], closure_then_measure, *args[2:]), kwargs

    def _meet(self) -> None:
        """Every rank at this step before the step's first collective (:mod:`.ranks`)."""
        if self.meeting is None:
            return
        try:
            self.meeting.meet(self.state.count, self.forwards)
        except RanksApart as apart:  # recorded on the rank(s) at fault; no collective was started
            for r in apart.ranks:
                self._failed(apart.findings[r], r)
            first = apart.ranks[0]
            f = apart.findings[first]
            apart.finding = StepFinding(self.state.count, first, f.code, f.severity, f.where, f.message)
            raise

    def gradients_ready(self) -> None:
        """Take this step's gradient numbers now, before something changes the gradients ahead of the
        optimizer's step (a clip: the Trainer's integration calls it once the gradients are unscaled,
        so the run holds the pre-clip norm the Trainer logs); the step then does not take them again."""
        with torch.no_grad():
            self._pre_step()

    def _pre_step(self) -> None:
        self._pre_done = True
        self._meet()
        check = self.state.count % self.every == 0
        if check:
            refresh(self.root)  # a module swapped in since: its parameters are read, not the old ones
        params = current(self.root, self.layout.parameters)
        stepping = self.others.active(self.state.count) if self.others is not None else []
        findings = (self._pending + self.modes.findings()
                    + self.clearing.findings(self.layout.parameters, params, lambda: self._held(stepping)))
        self._pending = []
        if check and self.optimizer is not None:
            self.clearing.attach(params)
            held = self._held()
            self._held_mask = np.array([p is not None and id(p) in held for p in params], dtype=bool)
            findings += replaced_findings(not_in_optimizer(self.layout.parameters, params, held),
                                          self.state.count)
        if self.others is not None:
            findings += self.others.findings(self.state.count)
        if check:
            findings += self._tie_findings()
        self.state.pre(params, check and self.update_ratio, findings)
        if self.keeper is not None:
            self.keeper.weights(self.state.grad_parts, self._scalars.get("loss"))
        if check and self.distributed:  # with the gradient norms just taken: the gradients are read once
            from ..distributed import check_step  # here: inspector.distributed re-exports read_run

            norms = torch.zeros(len(self.layout.parameters), dtype=torch.float64)
            for idx, part in self.state.grad_parts:
                norms[torch.from_numpy(idx)] = part.to("cpu", torch.float64)
            loss = self._scalars.get("loss")  # logged before optimizer.step(): check_step names its rank too
            self._check_found = check_step(self.model, self.state.count, path=None, group=self.group,
                                           loss=loss, timeout=self.timeout,
                                           grad_norms=(self.layout.parameters, norms)).findings

    def _tie_findings(self) -> list[Finding]:
        ids = self._tie_ids()
        if ids == self.tie_ids:
            return []
        self.tie_ids = ids
        return compare_ties(self.ties, self.root)

    def _post_step(self) -> None:
        if not self._pre_done:  # a closure the optimizer never called
            self._pre_step()
        self._pre_done = False
        check = self.state.count % self.every == 0
        numbers, scalars = transfer_step(self, check)
        # check_step's findings are the same on every rank (worked out from the gathered columns): each
        # rank places them itself, on the row of the rank each is about
        own = self.state.findings + self._own(numbers)
        checked, self._check_found = self._check_found, []
        # only what begins something travels (a finding that goes on, step after step, stays here): every
        # rank's episodes of this rank's findings then agree with this rank's own
        step, new = self.state.count, self._episodes.would_start
        shipped = [f for f in own if new(step, self.rank, f)] if self.world > 1 else own
        numbers.shared = float(len(shipped))
        numbers.compute = self.clock.take(self.state.start)
        errors = self.stop_on_error and any(f.severity == "error" for f in own + checked)
        numbers.stop = float(self.stop_requested or errors)
        numbers_all = gather_numbers(numbers, self.layout, self.world, self.group)
        self.stop_agreed = self.stop_agreed or any(n.stop > 0 for n in numbers_all)
        found = merge_findings(shipped, numbers_all, self.world, self.group)
        found[self.rank] = own
        for r, f in slow_ranks([n.compute for n in numbers_all]):  # the same on every rank: no merge
            found[r].append(f)
        for f in checked:
            about = ranks_of(f)
            found[about[0] if about and about[0] < len(found) else 0].append(f)
        self._write(numbers_all, scalars, found)
        self.clearing.stepped(self.state.params)
        self.state.post()
        if self.keeper is not None:
            self.keeper.step_starts(self.state.count)

    def _own(self, n: Numbers) -> list[Finding]:
        """This rank's findings from its own numbers (its batch, loss, gradients, compute time)."""
        found = written_findings(self.state, self.layout.parameters)  # before the rest: what they followed
        found += nonfinite_findings(n, self.module_names, self.rank, self.world)
        found += self.detectors.gradients(n.param_grad, n.has_grad, n.module_grad)
        if n.loss_logged:
            found = self.detectors.loss(float(n.loss), found)
        found += nonfinite_gradients(n.module_nonfinite, self.layout.modules, found)
        if n.checked and not self.state.written:
            found += self.detectors.parameters(n.param_norm, n.buffer_norm, self.layout.buffers)
        found += self.progress.step(self._lrs(), n.param_norm if n.checked else None, n.param_grad,
                                    n.has_grad, bool(n.skipped), self._held_mask)
        return found

    def _write(self, per_rank: list[Numbers], scalars: dict[str, float], found: list[list[Finding]]) -> None:
        step = self.state.count
        records = []
        # under several ranks a NaN/Inf one module (or batch) produced spreads to every rank's gradients and
        # weights through the reduction: at the step its producer is named, those are its consequences
        # (noted as seen, so they are not new later either), and the producer is the one finding
        root = self.world > 1 and any(f.code in _PRODUCED for fs in found for f in fs)
        for rank, n in enumerate(per_rank):
            mine = found[rank]
            if root:
                self._first_time([f for f in mine if f.code in _SPREAD], step, rank, quiet=True)
                mine = [f for f in mine if f.code not in _SPREAD]
            new = self._first_time(mine, step, rank)
            if self._writer is not None:
                records.append(step_record(step, rank, n, scalars if rank == 0 else {}, self._lrs(), new))
        if self._writer is not None:
            self._writer.write(records)

    def _first_time(self, found: list[Finding], step: int, rank: int, quiet: bool = False) -> list[Finding]:
        """The findings of ``found`` that begin something at their (code, where, rank): seen for the first
        time, or back after they cleared (:class:`~inspector.utils.findings.Episodes`); ``quiet``: only
        noted as seen."""
        place = rank if self.world > 1 else 0
        fresh = group_findings((step, place, f) for f in found)  # one per (code, where) in this step
        new = []
        for _, _, f in self._episodes.starts((step, place, f) for _, _, f in fresh.values()):
            if quiet:
                continue
            new.append(f)
            sf = StepFinding(step, place, f.code, f.severity, f.where, f.message)
            self.findings.append(sf)
            if self.on_finding is not None:
                self.on_finding(sf)
            if self.keeper is not None:
                self.keeper.finding(sf)
        return new

    def _lrs(self) -> list[float]:
        return [float(g.get("lr", math.nan)) for o in self.optimizers for g in o.param_groups]


__all__ = ["Watch"]
