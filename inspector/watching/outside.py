"""What the watch records outside a step: a signal that ends the process (``run-failed`` naming it), a
step the GradScaler skipped (its own row, marked skipped), and a finding recorded at once on a row of no
step. :class:`OutsideSteps` holds these methods of :class:`~.core.Watch`, which is made of it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from ..replaying import StepKeeper
from ..utils.findings import Finding
from .checks import failure_finding
from .numbers import Numbers
from .roles import Ranks, Recorder, Scalars, Target
from .rows import step_record
from .steps import StepState
from .table import At, Checks
from .tracer import NonfiniteTracer


class Terminated(BaseException):
    """The process was sent a signal that ends it (recorded as ``run-failed`` before it ends)."""



class OutsideSteps:
    """The watch's methods outside a step (the attributes are the :class:`~.core.Watch`'s)."""

    state: StepState
    ranks: Ranks
    target: Target
    scalars: Scalars
    checks: Checks
    recorder: Recorder
    keeper: StepKeeper | None
    tracer: NonfiniteTracer | None
    _stack: ExitStack
    _pre_done: bool
    _forward_open: bool
    _at: Callable[..., At]

    def _on_terminate(self) -> None:
        """SIGTERM (what torchrun, schedulers and ``kill`` send) with no handler of the program's own:
        record ``run-failed`` naming the signal, then end as the signal would have (its default action,
        its exit status). A program's own handler is left alone. Main thread only; put back at close."""
        if threading.current_thread() is not threading.main_thread():
            return
        before = signal.getsignal(signal.SIGTERM)
        if before not in (signal.SIG_DFL, None):
            return

        def terminated(signum: int, frame: Any) -> None:
            name = signal.Signals(signum).name
            self._record_now(failure_finding(Terminated(f"{name} (signal {signum}) from outside the "
                                                        "program: torchrun, a scheduler or kill"),
                                             self.state.count), self.ranks.rank)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

        signal.signal(signal.SIGTERM, terminated)
        self._stack.callback(signal.signal, signal.SIGTERM, before)

    def _follow_scaler(self, scaler: Any) -> None:
        """Wrap ``scaler.update`` on the instance (the class's method is back at close): an update with no
        optimizer step since the last one is a step the scaler skipped (:meth:`_skipped_step`)."""
        update, seen = scaler.update, [self.state.count]

        def followed(*args: Any, **kwargs: Any) -> Any:
            out = update(*args, **kwargs)
            if self.state.count == seen[0]:
                self._skipped_step(scaler, new_scale=bool(args or kwargs))
            seen[0] = self.state.count
            return out

        had = "update" in vars(scaler)
        scaler.update = followed
        self._stack.callback(lambda: setattr(scaler, "update", update) if had else vars(scaler).pop("update"))

    def _skipped_step(self, scaler: Any, new_scale: bool) -> None:
        """A step the GradScaler skipped (its gradients held Inf/NaN, so ``optimizer.step()`` never ran)
        is a step of the run all the same: its own row, marked skipped, with the scale it overflowed at
        (the scale now over the scaler's backoff factor, unless ``update()`` was given a new scale), the
        scalars logged for it, and what the ``skipped`` rows find; the next step is the next number. Its
        gradients are not measured: they are scaled, and Inf by definition. One host sync, on a skipped
        step only."""
        st, r = self.state, self.ranks
        layout = self.target.layout
        n = Numbers(len(layout.modules), len(layout.parameters), len(layout.buffers))
        now = float(scaler.get_scale())
        backoff = float(scaler.get_backoff_factor()) if hasattr(scaler, "get_backoff_factor") else 0.0
        n.skipped, n.scale = 1.0, now if new_scale or not 0 < backoff < 1 else now / backoff
        n.step_time = time.perf_counter() - st.start
        logged = {k: float(v) for k, v in self.scalars.take().items()}
        n.loss_logged = float("loss" in logged)
        n.loss = logged.pop("loss", float("nan"))
        found = self.checks.run("skipped", self._at(numbers=n), [])
        new = self.recorder.first_time(found, st.count, r.rank)
        if self.recorder.writer is not None:
            self.recorder.writer.write([step_record(st.count, r.rank, n, logged, self.target.lrs(), new)],
                                       now=bool(new))
        st.last_scale = now  # the next step's scale: no fall, not skipped again
        st.count += 1
        st.start = time.perf_counter()
        # what the skipped step carried is not the next step's: its gradient numbers, its trace, its batch
        self._pre_done, self._forward_open = False, False
        st.batch = []
        if self.tracer is not None:
            self.tracer.take()
        self.ranks.clock.take(st.start)
        if self.keeper is not None:
            self.keeper.step_starts(st.count)

    def _record_now(self, f: Finding, rank: int) -> None:
        """Record ``f`` now, outside a step (a run that failed, a rank apart, a step the scaler skipped), on
        ``rank``'s row of no step."""
        new = self.recorder.first_time([f], self.state.count, rank)
        writer = self.recorder.writer
        if writer is not None and new:
            layout = self.target.layout
            n = Numbers(len(layout.modules), len(layout.parameters), len(layout.buffers))
            try:
                writer.write([step_record(self.state.count, rank, n, {}, self.target.lrs(), new)], now=True)
            except Exception:  # noqa: BLE001 - the run's own error is the one to raise
                pass


__all__ = ["OutsideSteps", "Terminated"]
