"""``Watch.replay(step)``: a kept step run again on the model still in memory, during the watch or after it.

The watch's own hooks stay on the model while it runs (its forward hooks, the tracer's, the gradient
hooks its checks put on parameters, the keeper's pre-hook): a replay inside the block must not feed
them, or the watch would count the replayed forward as a training forward of the current step. So for
the replay the inspector's hooks are taken out of the model's hook dicts (the user's stay and fire, as
in training), and afterwards each dict holds again exactly what it held, in its order. The replay itself
puts the weights, buffers, gradients, modes, generators and version counters back (:func:`~.run.replay`),
so the run goes on as if no replay had happened.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from .run import CAPTURE_BYTES, Replay, replay

_MODULE_HOOKS = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
_TENSOR_HOOKS = ("_backward_hooks", "_post_accumulate_grad_hooks")


def _inspectors(hook: Any) -> bool:
    """Whether ``hook`` is the inspector's own (its function or its object's class is defined in the
    ``inspector`` package, the labs' models aside: their hooks are model code)."""
    while isinstance(hook, functools.partial):
        hook = hook.func
    fn = getattr(hook, "__func__", hook)
    where = [getattr(fn, "__module__", None) or "", type(getattr(hook, "__self__", hook)).__module__]
    return any(w.startswith("inspector.") and not w.startswith("inspector.labs") for w in where)


@contextmanager
def inspector_hooks_off(root: nn.Module) -> Iterator[None]:
    """Within the block the inspector's hooks on ``root``'s modules, parameters and buffers are out of
    their dicts; afterwards every dict holds again what it held, in its order (the same dict objects, so
    the handles that remove them still work)."""
    saved: list[tuple[dict, list]] = []
    owners: list[tuple[Any, tuple[str, ...]]] = [(m, _MODULE_HOOKS) for m in root.modules()]
    owners += [(t, _TENSOR_HOOKS) for t in (*root.parameters(), *root.buffers())]
    for owner, attrs in owners:
        for attr in attrs:
            d = getattr(owner, attr, None)
            if not d:
                continue
            items = list(d.items())
            ours = [k for k, h in items if _inspectors(h)]
            if ours:
                saved.append((d, items))
                for k in ours:
                    del d[k]
    try:
        yield
    finally:
        for d, items in saved:
            d.clear()
            d.update(items)


def replay_live(
    run_path: str | os.PathLike,
    step: int,
    root: nn.Module,
    *,
    rank: int = 0,
    loss: Callable[[Any, Any], torch.Tensor] | None = None,
    capture_bytes: int = CAPTURE_BYTES,
    tolerance: float | None = None,
) -> Replay:
    """:func:`~.run.replay` of ``step`` on ``root``, a model a watch may still follow: its hooks quiet,
    the model (versions included) as it was afterwards. What ``Watch.replay`` runs."""
    with inspector_hooks_off(root):
        return replay(run_path, step, root, loss=loss, rank=rank, capture_bytes=capture_bytes,
                      tolerance=tolerance)


__all__ = ["inspector_hooks_off", "replay_live"]
