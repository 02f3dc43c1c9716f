"""``watch``: one context manager around a training loop that records every step.

A :class:`Watch` is made of parts with one role each (:mod:`.roles`): frozen options, the frozen target,
the ranks, a recorder and a stop control. It orchestrates: at each event of a step it builds the
read-only :class:`~.table.At` and runs the rows of :data:`~.table.WATCH_CHECKS` for that phase; which
condition fires which finding, and in which order, is decided there, not here. Here: its parts, the
user's calls, its hooks, and one step's work from its numbers to its row; what comes before the
optimizer's step (the pre-step hook, the ranks' check-ins, the clip) is in :mod:`.prestep`, what is
recorded outside a step (a signal, a step the scaler skipped) in :mod:`.outside` (its
``Terminated`` is handed on here)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from ..replaying import Replay, StepKeeper, replay_live
from ..runfiles import RunMeta, RunWriter, StepFinding
from ..utils.findings import Finding, InspectorError
from .checks import Optimizers
from .gather import gather_numbers, merge_findings
from .layout import current, refresh
from .numbers import Numbers
from .outside import OutsideSteps
from .outside import Terminated as Terminated
from .prestep import BeforeStep
from .producer import producer_at_forward_end
from .ranks import model_key
from .result import WatchResult
from .roles import Ranks, Recorder, Scalars, StopControl, Target, WatchOptions
from .rows import step_record
from .rules.before import check_findings
from .steps import StepState, transfer_step
from .table import At, ByRank, Checks, Kit
from .tracer import NonfiniteTracer

HOLD = 0.5  # seconds a step's row may wait before it is on disk: a reader following the file lags that much
HOLD_STEPS = 64  # or this many steps held: written as one record batch


class Watch(BeforeStep, OutsideSteps):
    """The object ``with watch(...) as w`` gives: :meth:`log`, :meth:`step`, ``findings`` so far."""

    def __init__(self, model: nn.Module, optimizer: Optimizers, path: str | os.PathLike, *,
                 every: int = 1, nonfinite: bool = False, update_ratio: bool = False, scaler: Any = None,
                 window: int = 5, explode_factor: float = 8.0, loss_factor: float = 3.0,
                 recur_after: int = 5, capture_bytes: int = 64 << 20,
                 group: Any = None, distributed: bool | None = None, name: str = "", note: str = "",
                 timeout: float = 300.0, on_finding: Callable[[StepFinding], None] | None = None,
                 keep: bool | int = False, keep_weights: bool = False, keep_bytes: int = 1 << 30) -> None:
        self.target = t = Target.of(model, optimizer)
        self.options = WatchOptions(every, nonfinite, update_ratio, scaler, window, explode_factor,
                                    loss_factor, recur_after, capture_bytes, distributed, name, note, timeout,
                                    on_finding)
        self.path = str(path)
        self.ranks = Ranks(group, distributed, t.sharded, timeout)
        self.meta = RunMeta(name or type(t.root).__name__, self.ranks.world, every, t.layout.modules,
                            t.layout.parameters, tuple(int(i) for i in t.layout.owner),
                            tuple(c for c, on in (("nonfinite", nonfinite), ("update_ratio", update_ratio),
                                                  ("distributed", self.ranks.distributed)) if on),
                            update_ratio, time.time(), note)
        self.keeper = StepKeeper(  # the last steps, kept for inspector.replay (docs/replay.md)
            t.root, path, steps=keep if type(keep) is int and keep else 2, keep_weights=keep_weights,
            max_bytes=keep_bytes, rank=self.ranks.rank, world=self.ranks.world, model=self.meta.model,
            explode_factor=explode_factor) if keep or keep_weights else None
        self.kit = Kit(t, self.options)
        self.checks = Checks(self.kit)
        self.recorder = Recorder(self.path, self.ranks.world, max(recur_after, every),
                                 self._found if on_finding is not None or self.keeper is not None else None)
        self.control = StopControl()
        self.scalars = Scalars()
        self.state = StepState()
        self.tracer: NonfiniteTracer | None = None
        self.result: WatchResult | None = None
        self._stack = ExitStack()  # every hook and what a check attached, undone in one place at close
        self._pending: list[Finding] = []  # the open phase's findings, reported at the first step
        self._measured: list[Finding] = []  # the measured phase's, placed once the numbers are gathered
        self._pre_done = False  # the step's numbers are taken (before a clip, or by a closure)
        self._held_mask: np.ndarray | None = None  # the parameters an optimizer holds, at the last check
        self._step_hooks: list[Any] = []  # the first optimizer's pre- and post-step hooks
        self._in_step = False  # between the first optimizer's pre- and post-step hooks
        self._forward_open = False  # a training forward pass ran since the last step

    # -- the user's calls ------------------------------------------------------------------
    def log(self, **scalars: Any) -> None:
        """Record scalars (floats or 0-d tensors, kept on their device) with the current step."""
        self.scalars.log(**scalars)

    def step(self) -> None:
        """Mark the end of a step (only for loops without an optimizer passed to ``watch``)."""
        if self.target.optimizer is not None:
            raise InspectorError("with an optimizer, each optimizer.step() is a step; w.step() is for loops "
                                 "without one")
        if not self._pre_done:  # else taken already (w.clip_grad_norm_, gradients_ready)
            self._pre_step()
        self._post_step()

    @property
    def steps(self) -> int:
        return self.state.count

    def flush(self) -> None:
        """Write the steps held back now (the run file holds them for at most half a second, and writes a
        step with a new finding, a stop or a failure at once; see docs/training.md)."""
        if self.recorder.writer is not None:
            self.recorder.writer.flush()

    def replay(self, step: int, *, loss: Callable[[Any, Any], torch.Tensor] | None = None,
               capture_bytes: int = 256 << 20, tolerance: float | None = None) -> Replay:
        """Run kept step ``step`` again on the model in memory, inside the block or after it: what
        ``inspector.replay(w.path, step, model=...)`` gives, with this rank's kept step. The watch's hooks
        are quiet meanwhile and the model is left as it was (its weights, buffers, gradients, modes,
        version counters, and the generators), so the run goes on as if nothing had run."""
        if self._forward_open and isinstance(self.target.model, nn.parallel.DistributedDataParallel):
            raise InspectorError(
                f"w.replay({step}) between a training forward pass and its step under DDP would hand DDP's "
                "gradient all-reduce the replay's gradients instead of this step's: call it after "
                "optimizer.step() (or after the watch block), or replay on another model object with "
                f"inspector.replay({self.path!r}, {step}, model=...)")
        self.flush()  # the replay reads the run file's rows up to the step
        return replay_live(self.path, step, self.target.root, rank=self.ranks.rank, loss=loss,
                           capture_bytes=capture_bytes, tolerance=tolerance)

    # -- what the parts hold, read-only (the stop flags: :class:`StopControl`) ---------------------
    model = property(lambda self: self.target.model)
    root = property(lambda self: self.target.root)
    optimizer = property(lambda self: self.target.optimizer)
    optimizers = property(lambda self: list(self.target.optimizers))
    layout = property(lambda self: self.target.layout)
    module_names = property(lambda self: self.target.module_names)
    sharded = property(lambda self: self.target.sharded)
    every = property(lambda self: self.options.every)
    scaler = property(lambda self: self.options.scaler)
    update_ratio = property(lambda self: self.options.update_ratio)
    rank = property(lambda self: self.ranks.rank)
    world = property(lambda self: self.ranks.world)
    findings = property(lambda self: self.recorder.findings)
    captures = property(lambda self: self.recorder.captures)
    stop_agreed = property(lambda self: self.control.agreed)

    @property
    def opened(self) -> bool:
        """Whether the run file or the ranks' meeting was opened (a failure is then recorded)."""
        return self.recorder.writer is not None or self.ranks.meeting is not None

    @property
    def stop_on_error(self) -> bool:
        return self.control.on_error

    @stop_on_error.setter
    def stop_on_error(self, on: bool) -> None:
        self.control.on_error = on

    @property
    def stop_requested(self) -> bool:
        return self.control.requested

    @stop_requested.setter
    def stop_requested(self, on: bool) -> None:
        self.control.requested = on

    # -- hooks -------------------------------------------------------------------------------
    def open(self) -> None:
        t, r, hold = self.target, self.ranks, self._stack.enter_context
        if r.rank == 0:
            self.recorder.writer = RunWriter(self.path, self.meta, hold=HOLD, hold_steps=HOLD_STEPS)
        r.open(model_key(t.root, t.layout))
        if r.meeting is not None:  # first of the forward's hooks: before DDP's and FSDP's collectives
            hold(t.model.register_forward_pre_hook(self._forward_starts, prepend=True))
        if self.options.nonfinite:
            from ..runfiles.captured import remove_captures

            remove_captures(self.path, r.rank, r.world)
        hold(t.root.register_forward_hook(self._forwarded, with_kwargs=True))
        if self.keeper is not None:
            for h in self.keeper.attach():
                hold(h)
        if r.world > 1:  # each rank's own time before the step's first collective (slow-rank)
            for h in r.clock.attach(t.model, t.root):
                hold(h)
        if self.options.nonfinite:
            self.tracer = NonfiniteTracer(t.root, backward=True, keep=self.options.kept_bytes > 0)
            self._stack.callback(self.tracer.remove)
            hold(t.root.register_forward_hook(self._forward_end))
        if t.optimizer is not None:
            self._hook_steps(t.optimizer)
            self._stack.callback(self._unhook_steps)
            # any optimizer's step, to say at once when another one steps the watched parameters
            hold(register_optimizer_step_post_hook(self._any_step))
        self._on_terminate()
        self._stack.callback(self.state.resident.close)
        scaler = self.options.scaler
        if scaler is not None and callable(getattr(scaler, "update", None)):
            self._follow_scaler(scaler)
        at = self._at(params=current(t.root, t.layout.parameters))
        self.checks.attach(at, self._stack)
        self.state.start = time.perf_counter()
        self._pending = self.checks.run("open", at, [])

    def close(self, completed: bool, error: BaseException | None = None) -> WatchResult:
        """Remove every hook, close the file and freeze the result (safe after a failed open). An
        ``error`` that ended the block is recorded as a ``run-failed`` finding at the step it was in."""
        meeting = self.ranks.meeting
        if meeting is not None:  # the other ranks learn how this one ended; rank 0 records theirs
            meeting.ended(self.state.count, self.ranks.forwards, error)
        for rank, f in self.checks.run("close", self._at(error=error), []):
            self._record_now(f, rank)
        self._stack.close()
        self.result = self.recorder.finish(self.state.count, completed)
        if self.keeper is not None:
            self.keeper.close()
        return self.result

    def _found(self, sf: StepFinding) -> None:
        """Each new finding, to the user's ``on_finding`` and then to the steps kept for replay."""
        if self.options.on_finding is not None:
            self.options.on_finding(sf)
        if self.keeper is not None:
            self.keeper.finding(sf)

    def use_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Follow ``optimizer`` from its next step on, in place of the first optimizer given to the watch
        (a new optimizer built mid-run, a second training phase). Its steps are the steps; the run file,
        the step count and every check's history go on."""
        t = self.target
        if t.optimizer is None:
            raise InspectorError("use_optimizer is for a watch given an optimizer; this one counts w.step()")
        new = Target.of(t.model, [optimizer, *t.optimizers[1:]])
        self._unhook_steps()
        self.target = replace(t, optimizers=new.optimizers)
        self._hook_steps(optimizer)
        if self.kit.optimizer_steps is not None:
            self.kit.optimizer_steps.first_is(optimizer, self.target.names_of(optimizer))

    def _hook_steps(self, optimizer: torch.optim.Optimizer) -> None:
        self._step_hooks = [optimizer.register_step_pre_hook(self._step_starts),
                            optimizer.register_step_post_hook(self._step_ends)]

    def _unhook_steps(self) -> None:
        for h in self._step_hooks:
            h.remove()
        self._step_hooks = []

    def _step_ends(self, *args: Any) -> None:
        self._in_step = False
        self._post_step()

    def _any_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        """Every optimizer's post-step hook: one the watch was not given, stepping the watched optimizers'
        parameters outside their own step, runs the ``other-step`` rows."""
        if self._in_step or optimizer is self.target.optimizer or any(
                optimizer is o for o in self.target.optimizers):
            return
        held = self.target.held()
        if any(id(p) in held for g in optimizer.param_groups for p in g["params"]):
            for f in self.checks.run("other-step", self._at(other=optimizer), []):
                self._record_now(f, self.ranks.rank)

    def _forwarded(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        if module.training and torch.is_grad_enabled():  # a training forward: its batch as the model took it
            self._forward_open = True
            if self.ranks.meeting is not None:
                self.ranks.forwarded(output)
            if self.tracer is None:  # the tracer sees the batch itself
                self.state.see_batch(args, kwargs)

    def _forward_end(self, module: nn.Module, args: Any, output: Any) -> None:
        if self.tracer is not None and self.recorder.captures is None:
            self.recorder.captures = producer_at_forward_end(
                self.tracer, self.target.module_names[0], self.options.kept_bytes, self.state.count,
                self.ranks.rank, self.path, self.ranks.world)

    # -- one step ----------------------------------------------------------------------------
    def _at(self, check: bool = False, **now: Any) -> At:
        return At(self.state.count, check, self.target, self.ranks, state=self.state,
                  held_mask=self._held_mask, **now)

    def _pre_step(self) -> None:
        self._pre_done = True
        self._check_in("step")
        t = self.target
        check = self.state.count % self.options.every == 0
        if check:
            refresh(t.root)  # a module swapped in since: its parameters are read, not the old ones
        params = current(t.root, t.layout.parameters)
        held = None
        if check and t.optimizer is not None:
            held = t.held()
            self._held_mask = np.fromiter(map(held.__contains__, map(id, params)), dtype=bool,
                                          count=len(params))
        loss = self.scalars.get("loss")
        at = self._at(check, params=params, held=held, loss=loss)  # one event: the step's before and measured
        found, self._pending = self.checks.run("before-step", at, self._pending), []
        self.state.pre(params, check and self.options.update_ratio, found)
        if self.keeper is not None:
            self.keeper.weights(self.state.grad_parts, loss)
        # with the gradient norms just taken: the gradients are read once
        self._measured = self.checks.run("measured", at, [])

    def _post_step(self) -> None:
        if not self._pre_done:  # a closure the optimizer never called
            self._pre_step()
        self._pre_done = False
        st, r, t = self.state, self.ranks, self.target
        check = st.count % self.options.every == 0
        numbers, scalars = transfer_step(self, check, self.scalars.take())
        lrs = t.lrs()
        own = self.checks.run("after-step", self._at(check, params=st.params, numbers=numbers, lrs=lrs),
                              list(st.findings))
        # only what begins something travels (a finding that goes on, step after step, stays here): every
        # rank's episodes of this rank's findings then agree with this rank's own
        step = st.count
        shipped = [f for f in own if self.recorder.would_start(step, r.rank, f)] if r.world > 1 else own
        numbers.shared = float(len(shipped))
        numbers.compute = r.clock.take(st.start)
        measured, self._measured = self._measured, []
        numbers.stop = self.control.flag(bool(own or measured) and any(
            f.severity == "error" for f in own + measured))
        local, st.check_local = st.check_local, None  # the distributed check's numbers, sent with these
        numbers_all, rows = gather_numbers(numbers, t.layout, r.world, r.group,
                                           None if local is None else local.packed)
        self.control.gathered([n.stop for n in numbers_all])
        if local is not None:  # its findings are the same on every rank, and so is the stop they ask for
            checked = check_findings(local, rows)
            measured += checked
            self.control.gathered([self.control.flag(any(f.severity == "error" for f in checked))])
        found = merge_findings(shipped, numbers_all, r.world, r.group)
        found[r.rank] = own
        # the distributed check's findings are the same on every rank (worked out from the gathered
        # columns): each rank places them itself, on the row of the rank each is about
        at = self._at(check, numbers_all=numbers_all, measured=measured,
                      starts=partial(self.recorder.would_start, step))
        gathered = self.checks.run("gathered", at, ByRank(found, [[] for _ in found]))
        self._write(numbers_all, scalars, gathered, lrs)
        st.post()
        self._forward_open = False
        if self.keeper is not None:
            self.keeper.step_starts(st.count)

    def _write(self, per_rank: list[Numbers], scalars: dict[str, float], gathered: ByRank,
               lrs: list[float]) -> None:
        step, writer = self.state.count, self.recorder.writer
        new: dict[int, list[Finding]] = {}
        for rank in gathered.order or range(len(per_rank)):  # the table's order (the origin's rank first)
            self.recorder.first_time(gathered.quiet[rank], step, rank, quiet=True)
            new[rank] = self.recorder.first_time(gathered.found[rank], step, rank)
        if writer is not None:  # rows in rank order; a reader puts the origin's findings first again
            # the first step, a finding or a stop is on disk at once; other steps may wait up to HOLD seconds
            writer.write([step_record(step, rank, n, scalars if rank == 0 else {}, lrs, new[rank])
                          for rank, n in enumerate(per_rank)],
                         now=step == 0 or any(new.values()) or self.control.agreed or self.control.requested)


__all__ = ["Watch"]
