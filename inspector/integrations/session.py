"""What every integration shares: one watch opened on the stack's own model and optimizer,
findings printed as they appear, tracker exports after each step, and an optional stop on the
first error finding (Keras' ``TerminateOnNaN``, but naming the module and the step)."""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from ..utils.escaping import terminal_line
from ..utils.findings import InspectorError
from ..utils.labels import module_label
from ..watching import StepFinding, Watch, WatchResult
from .follow import RunFollower
from .trackers import Export, make_export


class TrainingStopped(InspectorError):
    """Raised (accelerate loops) or noted (Trainer, Lightning) when ``stop_on_error`` stops training."""

    def __init__(self, finding: StepFinding, world: int = 1) -> None:
        self.finding = finding
        super().__init__(stop_message(finding, world))


def stop_message(f: StepFinding, world: int = 1) -> str:
    """Why training stopped, safe for a terminal (names come from the model); on ``world`` > 1 ranks it
    names the rank of the finding (rank 0 too)."""
    on = f" on rank {f.rank}" if world > 1 and f.rank is not None else ""
    return terminal_line(f"training stopped at step {f.step}{on}: {f.code} at {module_label(f.where)} "
                         f"({f.message}); the run file holds every step up to here")


def plain_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside a stack's wrapper (accelerate's ``AcceleratedOptimizer``,
    Lightning's ``LightningOptimizer``): the watch's step hooks go on the one that really steps."""
    seen = 0
    while optimizer is not None and seen < 8:
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or inner is optimizer:
            break
        optimizer, seen = inner, seen + 1
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise InspectorError(f"cannot watch the optimizer {type(optimizer).__name__}: no "
                             "torch.optim.Optimizer inside it")
    return optimizer


def print_finding(f: StepFinding) -> None:
    print(f"[inspector] {terminal_line(f.line())}", file=sys.stderr, flush=True)


class WatchedTraining:
    """A watch a training stack opens and closes through its callbacks.

    Args:
        path: the run file.
        stop_on_error: stop training at the first finding of severity ``error``.
        export: trackers (``TensorBoardExport(...)``, ``"tensorboard:<logdir>"``, ``"wandb"``, ``"mlflow"``).
        report: called with each new finding (default: one line on stderr; None: silent).
        **options: passed on to :func:`inspector.watch` (``every``, ``nonfinite``, ``update_ratio``, ...).
    """

    def __init__(self, path: str | os.PathLike, *, stop_on_error: bool = False, export: Iterable[Any] = (),
                 report: Callable[[StepFinding], None] | None = print_finding, **options: Any) -> None:
        if "on_finding" in options:
            raise InspectorError("give report=... (called with each new finding) instead of on_finding")
        self.path, self.stop_on_error, self.report, self.options = str(path), stop_on_error, report, options
        self.exports: list[Export] = [make_export(e) for e in export]
        self.watch: Watch | None = None
        self.stopped_by: StepFinding | None = None
        self.rank = 0  # this process's rank in the watch's group: only rank 0 reports
        self.world = 1  # the ranks in the watch's group
        self._agreed = False
        self.result: WatchResult | None = None
        self._follower: RunFollower | None = None

    @property
    def active(self) -> bool:
        return self.watch is not None

    def start(self, model: nn.Module, optimizer: Any, *, scaler: Any = None, name: str = "") -> Watch:
        """Open the watch (closing one left open by an earlier run that never ended)."""
        if self.watch is not None:
            self.finish(completed=False)
        options = dict(self.options)
        if scaler is not None and options.get("scaler") is None:
            options["scaler"] = scaler
        if name and not options.get("name"):
            options["name"] = name
        self.stopped_by, self.result, self._agreed = None, None, False
        plain: Any = ([plain_optimizer(o) for o in optimizer] if isinstance(optimizer, (list, tuple))
                      else plain_optimizer(optimizer))
        w = Watch(model, plain, self.path, on_finding=self._found, **options)
        w.stop_on_error, self.rank, self.world = self.stop_on_error, w.rank, w.world
        try:
            w.open()
        except BaseException:
            w.close(False)
            raise
        self.watch = w
        self._follower = RunFollower(self.path) if self.exports else None
        atexit.register(self._at_exit)  # a run that raised out of a stack without an exception hook
        return w

    def _at_exit(self) -> None:
        # an exception that ended the program unhandled is kept in sys.last_value (Python >= 3.12 also
        # sys.last_exc) by the time exit handlers run
        self.finish(completed=False, error=getattr(sys, "last_value", None))

    @property
    def should_stop(self) -> bool:
        """Whether to stop now: the same answer on every rank at the same step (the watch gathers every
        rank's stop flag with its numbers), so no rank stops alone while another waits for it."""
        if self.watch is not None:
            self._agreed = self.watch.stop_agreed
        return self._agreed

    def stop_finding(self) -> StepFinding:
        """The finding training stopped at: the first error recorded, on any rank (at a step where a rank's
        batch, forward or loss went NaN/Inf, that rank's finding: the watch records it first)."""
        return self.stopped_by or StepFinding(self.watch.state.count if self.watch else 0, None, "run-failed",
                                              "error", "", "another rank asked every rank to stop")

    def stop_line(self) -> str:
        """:func:`stop_message` of :meth:`stop_finding` (naming its rank on several ranks)."""
        return stop_message(self.stop_finding(), self.world)

    def _found(self, f: StepFinding) -> None:
        # every rank holds every rank's findings (merged at the step): rank 0 reports each once
        if self.report is not None and self.rank == 0:
            self.report(f)
        if self.stop_on_error and f.severity == "error" and self.stopped_by is None:
            self.stopped_by = f

    def log(self, **scalars: Any) -> None:
        if self.watch is not None:
            self.watch.log(**scalars)

    def after_step(self) -> None:
        """Send the steps written since the last call to the trackers."""
        if self._follower is None:
            return
        if self.watch is not None:  # the run file holds steps for up to 0.5 s: the trackers get each step now
            self.watch.flush()
        rows = self._follower.new_rows()
        if rows and self._follower.meta is not None:
            for e in self.exports:
                e.write(self._follower.meta, rows)

    def finish(self, completed: bool = True, error: BaseException | None = None) -> WatchResult | None:
        """Remove the hooks, close the run file and the exports (safe to call twice); an ``error`` that
        ended training is recorded in the file (``run-failed``)."""
        w, self.watch = self.watch, None
        if w is None:
            return self.result
        self._agreed = w.stop_agreed
        atexit.unregister(self._at_exit)
        try:
            self.result = w.close(completed, error)
            self.after_step()
        finally:
            for e in self.exports:
                e.close()
            self._follower = None
        return self.result


__all__ = ["TrainingStopped", "WatchedTraining", "plain_optimizer", "print_finding", "stop_message"]
