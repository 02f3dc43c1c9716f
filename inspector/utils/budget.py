"""A wall budget for one piece of work, checked between its chunks: ``with work_budget(60): ...``.

Long loops of the library (comparing tensors chunk by chunk, a report's sections, reading JSON lines)
call :func:`check_budget` between chunks. Outside a :func:`work_budget` it costs one context-variable
read and does nothing, so the library's own callers are never stopped; inside one it raises
:class:`WorkStopped` once the wall time is spent or once ``stop_if`` gives a reason (a dashboard
session that has gone). A server thus keeps no thread busy past the budget for a browser that left.

The budget belongs to the context that opened it (a thread starts with none), so work of other
threads and sessions is never stopped by it.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from .findings import InspectorError

ADVICE = "Ask for less (fewer sections, one checkpoint at a time), or run it from the command line."
POLL_SECONDS = 0.25  # ``stop_if`` is asked at most this often: it may take a lock or read a table


class WorkStopped(InspectorError):
    """Work stopped by its budget: the wall time was spent, or whoever asked for it has gone."""


@dataclass
class _Budget:
    what: str
    seconds: float | None
    stop_if: Callable[[], str | None] | None
    advice: str
    poll: float
    start: float
    polled: float = 0.0

    def check(self) -> None:
        now = time.monotonic()
        if self.seconds is not None and now - self.start > self.seconds:
            raise WorkStopped(
                f"{self.what} stopped after {now - self.start:.1f} s: it ran past its wall budget of "
                f"{self.seconds:g} s. {self.advice}")
        if self.stop_if is not None and now - self.polled >= self.poll:
            self.polled = now
            reason = self.stop_if()
            if reason:
                raise WorkStopped(f"{self.what} stopped after {now - self.start:.1f} s: {reason}")


_CURRENT: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("inspector_work_budget",
                                                                      default=None)


@contextmanager
def work_budget(seconds: float | None = None, *, stop_if: Callable[[], str | None] | None = None,
                what: str = "the work", advice: str = ADVICE,
                poll_seconds: float = POLL_SECONDS) -> Iterator[None]:
    """Bound the work done inside: :func:`check_budget` raises :class:`WorkStopped` after ``seconds``
    of wall time (``None``: no limit) or as soon as ``stop_if()`` returns a reason (a non-empty string;
    asked at most every ``poll_seconds``). ``what`` names the work in the message, ``advice`` says what to
    do once the time is spent. Budgets nest: the inner one is checked while it is open."""
    if seconds is not None and not seconds > 0:
        raise InspectorError(f"a work budget must be a positive number of seconds or None, got {seconds!r}")
    token = _CURRENT.set(_Budget(what, seconds, stop_if, advice, poll_seconds, time.monotonic()))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def check_budget() -> None:
    """Raise :class:`WorkStopped` if the open :func:`work_budget` is spent; nothing without one."""
    budget = _CURRENT.get()
    if budget is not None:
        budget.check()
