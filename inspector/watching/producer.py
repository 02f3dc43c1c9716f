"""A copy of the inputs and outputs of the module that first produced a NaN/Inf, taken during the step
(:mod:`inspector.runfiles.captured` stores it next to the run file and reads it back)."""

from __future__ import annotations

from typing import Any

from ..capture import Captures, Skipped
from ..runfiles.captured import producer_note
from ..utils.labels import module_label
from .tracer import Producer, floating


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

