"""accelerate: ``with watch_accelerator(accelerator, model, optimizer, "run.inspect") as w:`` around
the loop, after ``accelerator.prepare``.

The watch sees through the prepared wrappers (DDP, ``torch.compile``, ``AcceleratedOptimizer``),
takes the accelerator's GradScaler, counts each real optimizer step (so
``accelerator.accumulate`` gives one step per update) and, with ``stop_on_error``, raises
:class:`.session.TrainingStopped` at the next forward after an error finding, naming the module.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

from .session import TrainingStopped, WatchedTraining, plain_optimizer


@contextmanager
def watch_accelerator(accelerator: Any, model: nn.Module, optimizer: Any,
                      path: str | os.PathLike = "run.inspect", **options: Any) -> Iterator[WatchedTraining]:
    """Watch an accelerate loop; ``w.log(loss=...)`` records the loss of the step (options as
    :class:`.session.WatchedTraining`)."""
    session = WatchedTraining(path, **options)
    scaler = getattr(accelerator, "scaler", None)
    session.start(model, optimizer, scaler=scaler, name=type(getattr(model, "module", model)).__name__)
    handles = []
    inner = plain_optimizer(optimizer)
    if inner is not None:
        handles.append(inner.register_step_post_hook(lambda *a: session.after_step()))
    if session.stop_on_error and session.watch is not None:
        def stop_here(module: nn.Module, args: Any) -> None:
            if session.should_stop:
                raise TrainingStopped(session.stop_finding(), session.world)

        handles.append(session.watch.root.register_forward_pre_hook(stop_here))
    completed, error = False, None
    try:
        yield session
        completed = True
    except BaseException as exc:
        error = exc
        raise
    finally:
        for h in handles:
            h.remove()
        session.finish(completed=completed and not session.should_stop, error=error)


__all__ = ["watch_accelerator"]
