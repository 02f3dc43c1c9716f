"""``watch``: the context manager around a training loop (the :class:`~.core.Watch` it opens and closes)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..runfiles import read_run  # noqa: F401 - the doctest reads the run back
from .core import Watch


@contextmanager
def watch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    path: str | os.PathLike = "run.inspect",
    **options: Any,
) -> Iterator[Watch]:
    """Watch a training loop: every step's numbers go to ``path``, findings name module and step.

    With an optimizer each ``optimizer.step()`` is a step (through its step hooks; a step given a
    closure is measured when the closure returns); with a list of optimizers, each step of the first
    (the others' are counted: ``optimizer-not-stepped``); without one, call ``w.step()``. Leaving
    the block, also on an exception or Ctrl-C, removes every hook and closes the file (an exception
    is recorded as ``run-failed``); the model and the optimizer are never changed. ``w.result`` is
    the frozen :class:`WatchResult` afterwards.

    Args:
        model: the model (DDP / ``torch.compile`` wrappers are seen through).
        optimizer: its optimizer, a list of optimizers (a GAN's), or None.
        path: the run file (Arrow; :func:`read_run` reads it, also while it grows).
        **options: ``every`` (parameter norms, ties, optimizer membership and the distributed
            checks every Nth step; gradient norms every step), ``nonfinite`` (name the module
            that produced a NaN/Inf, forward and backward), ``update_ratio`` (keeps a copy of
            the weights during each check step), ``scaler`` (an AMP ``GradScaler``),
            ``window``, ``explode_factor``, ``loss_factor`` (a loss over this many times its
            median is a ``loss-spike``), ``recur_after`` (a finding that recurs, such as
            ``exploding-gradient``, ``loss-spike`` and ``nonfinite-*``, is reported again when it comes
            back after this many steps without it), ``capture_bytes``, ``group``, ``distributed``,
            ``name``, ``note``, ``timeout`` (seconds, 300 by default, a rank waits at each check-in,
            before each training forward pass and each step, for the other ranks before it stops naming
            the rank that is late; a rank out of step is named at once), ``on_finding``
            (called with each new :class:`StepFinding`), ``keep`` (True or a number of steps: keep the last
            steps so that one can be replayed, :func:`inspector.replay`; docs/replay.md),
            ``keep_weights`` (copy the weights to the host at every step), ``keep_bytes`` (the most
            bytes the run's replay files may hold).

    >>> import tempfile, pathlib
    >>> m = nn.Linear(2, 1); opt = torch.optim.SGD(m.parameters(), lr=0.1)
    >>> folder = tempfile.TemporaryDirectory()
    >>> p = pathlib.Path(folder.name) / "run.inspect"
    >>> with watch(m, opt, p) as w:
    ...     for _ in range(3):
    ...         m(torch.ones(1, 2)).sum().backward(); opt.step(); opt.zero_grad()
    >>> w.result.steps, len(read_run(p).steps)
    (3, 3)
    >>> folder.cleanup()
    """
    w = Watch(model, optimizer, path, **options)
    completed, error = False, None
    try:
        w.open()
        yield w
        completed = True
    except BaseException as exc:
        error = exc
        raise
    finally:
        w.close(completed, error if w.opened else None)


__all__ = ["watch"]
