"""Non-finite forward and backward tracing without a host sync per module.

Each module call appends, on the device, one 0-d bool per floating tensor it saw ("holds a
NaN/Inf"), and on the host the call number, the module and whether the tensor was an input
or an output (or, in backward, the gradient of an input or of an output). The flags reach
the host once per step (:meth:`NonfiniteTracer.flags`), where the producer is the first call
whose outputs are non-finite while its inputs were finite. Forward hooks fire when a call
ends, so an inner module that produces an Inf is seen before the parents that contain it,
and modules downstream of it are excluded because their inputs are already non-finite.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..utils.dtensors import is_dtensor
from ..utils.labels import BATCH_LABEL

INPUT, OUTPUT = 0, 1
CHECKED = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # aminmax takes these
BATCH = BATCH_LABEL  # the name a non-finite batch gets


def floating(value: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """The floating-point tensors of a value and of its nested tuples, lists and dicts."""
    if isinstance(value, torch.Tensor):
        if value.dtype in CHECKED and value.numel():
            yield value
    elif depth < 3 and isinstance(value, (tuple, list)):
        for v in value:
            yield from floating(v, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for v in value.values():
            yield from floating(v, depth + 1)


def nonfinite_flag(t: torch.Tensor) -> torch.Tensor:
    """A 0-d bool tensor on ``t``'s device: ``t`` holds a NaN or an Inf (one pass, no copy of ``t``).

    For a DTensor, this rank's local piece: no collective inside a hook."""
    piece = t.to_local() if is_dtensor(t) else t
    low, high = torch.aminmax(piece.detach())  # NaN propagates into both
    return torch.logical_not(torch.isfinite(low) & torch.isfinite(high))


@dataclass(frozen=True)
class Producer:
    """The first module call whose outputs turned non-finite while its inputs were finite."""

    module: str
    call: int
    direction: str  # "forward" or "backward"


class NonfiniteTracer:
    """Forward (and optionally backward) hooks on every module of ``model``; see the module docstring.

    ``keep`` holds each call's inputs and outputs by reference until :meth:`forward_done`
    (used for the captures of the producer); :meth:`remove` takes every hook off.
    """

    def __init__(self, model: nn.Module, *, backward: bool, keep: bool) -> None:
        self.names = {id(m): n for n, m in model.named_modules()}
        self.backward = backward
        self.keep = keep
        self.calls: list[str] = []
        self.meta: list[tuple[int, int, int]] = []  # (call, INPUT/OUTPUT, 0 forward / 1 backward)
        self.values: list[torch.Tensor] = []
        self.kept: dict[int, tuple[Any, Any, int]] = {}  # call -> (args, output, first flag index)
        self.handles: list[RemovableHandle] = []
        self.leaf_handles: list[
            RemovableHandle
        ] = []  # gradient hooks on leaves (parameters): they outlive the graph
        try:
            for m in model.modules():
                self.handles.append(m.register_forward_hook(self._hook, with_kwargs=True))
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self._remove_leaf_hooks()
        self.kept.clear()

    def _remove_leaf_hooks(self) -> None:
        for h in self.leaf_handles:
            h.remove()
        self.leaf_handles.clear()

    def _add(self, call: int, kind: int, direction: int, t: torch.Tensor) -> None:
        self.meta.append((call, kind, direction))
        self.values.append(nonfinite_flag(t))

    def _hook(self, module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        call = len(self.calls)
        self.calls.append(self.names.get(id(module), type(module).__name__))
        first = len(self.values)
        ins = list(floating(args)) + list(floating(kwargs))
        outs = list(floating(output))
        for t in ins:
            self._add(call, INPUT, 0, t)
        for t in outs:
            self._add(call, OUTPUT, 0, t)
        if self.keep:
            self.kept[call] = (args, output, first)
        if self.backward and torch.is_grad_enabled():
            for kind, ts in ((INPUT, ins), (OUTPUT, outs)):
                for t in ts:
                    if t.requires_grad:
                        handle = t.register_hook(self._grad_hook(call, kind))
                        if t.is_leaf:
                            self.leaf_handles.append(handle)

    def _grad_hook(self, call: int, kind: int) -> Any:
        def hook(grad: torch.Tensor) -> None:
            if grad is not None and grad.dtype in CHECKED and grad.numel():
                self._add(call, kind, 1, grad)
        return hook

    def take(self) -> tuple[list[str], list[tuple[int, int, int]], list[torch.Tensor]]:
        """The calls, flag records and device flags gathered so far, and a fresh start (the
        gradient hooks put on leaf tensors this step are taken off)."""
        self._remove_leaf_hooks()
        out = (self.calls, self.meta, self.values)
        self.calls, self.meta, self.values = [], [], []
        self.kept.clear()
        return out


def producers(calls: list[str], meta: list[tuple[int, int, int]], flags: Any) -> list[Producer]:
    """The forward and the backward producer (each at most once) from host-side ``flags``.

    Events are scanned in the order they were recorded. Forward: the first non-finite output
    of a call whose inputs were finite. Backward (which runs the other way): the first
    non-finite input gradient of a call whose output gradients seen so far were finite; an
    inner module's gradient hooks fire before those of the parent that contains it.
    """
    found: dict[int, Producer] = {}
    upstream_bad: set[tuple[int, int]] = set()  # (direction, call) whose "source" side was non-finite
    for (call, kind, d), flag in zip(meta, flags, strict=True):
        if d in found or not flag:
            continue
        source, result = (INPUT, OUTPUT) if d == 0 else (OUTPUT, INPUT)
        if kind == source:
            upstream_bad.add((d, call))
        elif kind == result and (d, call) not in upstream_bad:
            found[d] = Producer(calls[call], call, "forward" if d == 0 else "backward")
    return [found[d] for d in sorted(found)]


def forward_producer(calls: list[str], meta: list[tuple[int, int, int]], flags: Any,
                     root: str) -> Producer | None:
    """The forward producer, or the batch (``BATCH``) when the root's own inputs were non-finite."""
    for (call, kind, d), flag in zip(meta, flags, strict=True):
        if d == 0 and kind == INPUT and flag and calls[call] == root:
            return Producer(BATCH, call, "forward")
    return next((p for p in producers(calls, meta, flags) if p.direction == "forward"), None)
