"""Each rank's own time before a step's first collective (:class:`ComputeClock`), and ``slow-rank`` for a
rank far over the others' (:func:`slow_ranks`)."""

from __future__ import annotations

import math
import time
from typing import Any

from torch import nn
from torch.utils.hooks import RemovableHandle

from ..utils.codes import coded
from ..utils.findings import Finding
from ..utils.labels import ROOT_LABEL


class ComputeClock:
    """A rank's own time before the step's first collective: from the step's start to the end of its
    first forward pass (to the forward's call under FSDP2 / tensor parallel, whose forward gathers;
    the call of the outer wrapper comes before DDP's buffer broadcast), less the time it waited for the
    other ranks at its check-in."""

    def __init__(self, sharded: bool) -> None:
        self.sharded = sharded
        self.called = self.forwarded = math.nan
        self.waited = 0.0

    def wait(self, seconds: float) -> None:
        """``seconds`` waited for the other ranks, counted until the step's mark is taken."""
        if math.isnan(self.called if self.sharded else self.forwarded):
            self.waited += seconds

    def attach(self, model: nn.Module, root: nn.Module) -> list[RemovableHandle]:
        return [model.register_forward_pre_hook(self._call), root.register_forward_hook(self._end)]

    def _call(self, module: nn.Module, args: Any) -> None:
        if math.isnan(self.called):
            self.called = time.perf_counter()

    def _end(self, module: nn.Module, args: Any, output: Any) -> None:
        if math.isnan(self.forwarded):
            self.forwarded = time.perf_counter()

    def take(self, start: float) -> float:
        """Seconds since ``start`` (NaN without a forward pass this step); starts the next step's."""
        end = self.called if self.sharded else self.forwarded
        self.called = self.forwarded = math.nan
        waited, self.waited = self.waited, 0.0
        return end - start - waited


def slow_ranks(times: list[float], at_least: float = 1.0, factor: float = 3.0) -> list[tuple[int, Finding]]:
    """``slow-rank`` for each rank whose time before the step's first collective (``times``, one per
    rank) is ``at_least`` seconds and ``factor`` times over the median of the other ranks'."""
    out = []
    for r, t in enumerate(times):
        others = sorted(v for i, v in enumerate(times) if i != r and v == v)
        if t != t or not others:
            continue
        middle = others[len(others) // 2] if len(others) % 2 else (others[len(others) // 2 - 1]
                                                                   + others[len(others) // 2]) / 2
        if t - middle >= at_least and t >= factor * middle:
            out.append((r, coded(
                "slow-rank", ROOT_LABEL,
                f"rank {r} took {t:.3g} s to load its batch and run its forward pass at this step, the other "
                f"ranks {middle:.3g} s: every rank waited for it in the step's first collective, so the step "
                "time is the same everywhere. Look at that rank's data loader, its batch sizes and its "
                "machine")))
    return out


__all__ = ["ComputeClock", "slow_ranks"]
