"""A copy of the inputs and outputs of the module that first produced a NaN/Inf, taken during the step
(:mod:`inspector.runfiles.captured` stores it next to the run file and reads it back)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..capture import Captures, Skipped
from ..runfiles.captured import producer_note
from ..utils.labels import module_label
from .tracer import NonfiniteTracer, Producer, floating, forward_producer


def _copy(value: Any, budget: list[int], module: str, kind: str, skipped: list[Skipped]) -> Any:
    """Detached clones of the floating tensors of ``value`` (a tensor or a flat structure) on the CPU."""
    out = []
    for i, t in enumerate(floating(value)):
        size = t.numel() * t.element_size()
        if size > budget[0]:
            skipped.append(Skipped(module, kind, f"[{i}]", size, "over the capture byte budget"))
            continue
        budget[0] -= size
        out.append(t.detach().to("cpu", copy=True))
    return out[0] if len(out) == 1 else tuple(out)


def capture_producer(kept: dict[int, tuple[Any, Any, int]], producer: Producer, max_bytes: int,
                     step: int, rank: int = 0) -> Captures:
    """A :class:`Captures` of the producer's inputs and outputs at ``step`` (within ``max_bytes``)."""
    name = (
        module_label(producer.module)
    )  # as the findings name them
    args, output, _ = kept.get(producer.call, ((), None, 0))
    budget: list[int] = [max_bytes]
    skipped: list[Skipped] = []
    inputs = {name: _copy(args, budget, name, "input", skipped)}
    outputs = {name: _copy(output, budget, name, "output", skipped)}
    return Captures(outputs=outputs, inputs=inputs, order=[name], skipped=skipped,
                    findings=[producer_note(name, step, rank)], store_on="cpu",
                    _state={"step": step, "rank": rank},
                    mutations_watched=False)  # one module's input and output, copied once: nothing watched


def producer_at_forward_end(tracer: NonfiniteTracer, root: str, max_bytes: int, step: int, rank: int,
                            path: str, world: int) -> Captures | None:
    """At the end of a forward pass: the captures of its first NaN/Inf producer (saved next to the run
    file ``path``), or None; the tracer then keeps no more calls (one capture per run)."""
    if not tracer.keep or not tracer.kept:
        return None
    from ..runfiles.captured import captures_path, save_captures
    from .layout import to_host

    flags = (to_host([torch.cat([v.reshape(-1) for v in tracer.values])]) if tracer.values
             else [np.zeros(0)])
    producer = forward_producer(tracer.calls, tracer.meta, flags[0] > 0, root)
    captures = None
    if producer is not None:
        captures = capture_producer(tracer.kept, producer, max_bytes, step, rank)
        save_captures(captures, captures_path(path, rank, world))
        tracer.keep = False
    tracer.kept.clear()
    return captures
