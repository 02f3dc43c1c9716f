"""What a check of the watch reads and threads at one event (:mod:`.table` runs the checks): the
read-only :class:`At`, the gathered phase's :class:`ByRank`, the :class:`Check` interface, and the
:class:`Kit` the checks are built from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, NamedTuple, Protocol

import numpy as np
import torch

from ..utils.findings import Finding, InspectorError
from .checks import OptimizerSteps
from .clearing import GradientClearing
from .detect import Detectors
from .numbers import Numbers
from .roles import Ranks, Target, WatchOptions
from .steps import StepState

Phase = Literal["open", "before-step", "measured", "after-step", "skipped", "other-step", "gathered", "close"]
PHASES: tuple[Phase, ...] = ("open", "before-step", "measured", "after-step", "skipped", "other-step",
                             "gathered", "close")
Placed = tuple[int, Finding]
_EMPTY: list[Any] = []  # the lists an At is not given (read, never written)


class At(NamedTuple):
    """What a check may read at one event (read-only: a check changes only its own state).

    ``params``: the parameters under their names now; ``held``: the ids of the parameters the
    optimizers hold (at check steps with an optimizer), ``held_mask`` the same per parameter;
    ``numbers``: this rank's numbers of the step (``after-step``); ``numbers_all``: every rank's
    (``gathered``); ``measured``: the ``measured`` phase's findings (``gathered``); ``starts``: whether a
    rank's finding begins something at this step, so is recorded (``gathered``); ``loss``: the loss
    logged before the step (``measured``); ``error``: what ended the block (``close``); ``other``: the
    optimizer that stepped (``other-step``). A named tuple: three are made at every step, at a quarter
    of a frozen dataclass's cost; its lists, where not given, are one shared empty list, never written."""

    step: int
    check: bool
    target: Target
    ranks: Ranks
    params: list[torch.Tensor | None] = _EMPTY
    state: StepState | None = None
    held: set[int] | None = None
    held_mask: np.ndarray | None = None
    lrs: list[float] = _EMPTY
    numbers: Numbers | None = None
    numbers_all: list[Numbers] = _EMPTY
    measured: list[Finding] = _EMPTY
    starts: Callable[[int, Finding], bool] | None = None
    loss: Any = None
    error: BaseException | None = None
    other: Any = None

    @property
    def n(self) -> Numbers:
        """This rank's numbers of the step (the ``after-step`` phase has them)."""
        if self.numbers is None:
            raise InspectorError("a check read a step's numbers outside the after-step phase")
        return self.numbers

    @property
    def st(self) -> StepState:
        """The step's state (every phase of a step has it)."""
        if self.state is None:
            raise InspectorError("a check read the step's state outside a step")
        return self.state


@dataclass
class ByRank:
    """The ``gathered`` phase's findings: each rank's to report, each rank's to note as seen only, and the
    order in which the ranks' findings are recorded (empty: rank order)."""

    found: list[list[Finding]]
    quiet: list[list[Finding]]
    order: list[int] = field(default_factory=list)


class Check(Protocol):
    """One check: reads ``at``, returns ``found`` with its findings added (or those it explains folded)."""

    def __call__(self, at: At, found: Any) -> Any: ...


class Kit:
    """What a table's checks are built from: the target, the options, and the state several rows share
    (one :class:`Detectors` for the gradient and loss rows, one :class:`GradientClearing` for the rows
    before and after the step, the optimizers' step counts)."""

    def __init__(self, target: Target, options: WatchOptions) -> None:
        self.target, self.options = target, options

    @cached_property
    def detectors(self) -> Detectors:
        o = self.options
        return Detectors(self.target.layout, window=o.window, explode_factor=o.explode_factor,
                         loss_factor=o.loss_factor)

    @cached_property
    def clearing(self) -> GradientClearing:
        return GradientClearing()

    @cached_property
    def optimizer_steps(self) -> OptimizerSteps | None:
        return OptimizerSteps(self.target.optimizers) if self.target.optimizer is not None else None


__all__ = ["At", "ByRank", "Check", "Kit", "PHASES", "Phase", "Placed"]
