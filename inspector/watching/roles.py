"""The parts a :class:`~.core.Watch` is made of, one role each: its frozen options, the frozen target it
watches, the ranks it runs on, the recorder that builds the run (then freezes into the
:class:`~.result.WatchResult`), the stop control, and the scalars ``w.log`` gave since the last step.
Each part's fields are written only by its own methods (or, for the stop control, by the one caller
each field names)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..capture import Captures
from ..runfiles import RunWriter, StepFinding
from ..utils.codes import recurs
from ..utils.dtensors import is_dtensor
from ..utils.findings import Episodes, Finding, InspectorError, group_findings
from ..utils.wrappers import underlying
from .checks import Optimizers, optimizer_list
from .clock import ComputeClock
from .layout import Layout
from .ranks import Meeting
from .result import WatchResult
from .tracer import floating


@dataclass(frozen=True)
class WatchOptions:
    """What the user asked of the watch (``watch``'s keyword options), fixed when it is made."""

    every: int = 1
    nonfinite: bool = False
    update_ratio: bool = False
    scaler: Any = None
    window: int = 5
    explode_factor: float = 8.0
    loss_factor: float = 3.0
    recur_after: int = 5
    capture_bytes: int = 64 << 20
    distributed: bool | None = None
    name: str = ""
    note: str = ""
    timeout: float = 300.0
    on_finding: Callable[[StepFinding], None] | None = None

    def __post_init__(self) -> None:
        if self.every < 1:
            raise InspectorError(f"every must be 1 or more, got {self.every}")

    @property
    def kept_bytes(self) -> int:
        """The producer's capture budget: 0 without ``nonfinite``."""
        return self.capture_bytes if self.nonfinite else 0


@dataclass(frozen=True, eq=False)
class Target:
    """What is watched: the model as given and the module under its wrappers, the optimizers (the
    first one's steps are the steps), the tensors followed and the module names in model order."""

    model: nn.Module
    root: nn.Module
    optimizers: tuple[torch.optim.Optimizer, ...]
    layout: Layout
    module_names: tuple[str, ...]
    sharded: bool  # FSDP2 / tensor parallel: some parameter is a DTensor

    @classmethod
    def of(cls, model: nn.Module, optimizer: Optimizers) -> Target:
        if not isinstance(model, nn.Module):
            raise InspectorError(f"watch needs an nn.Module, got {type(model).__name__}")
        optimizers = tuple(optimizer_list(optimizer))
        root = underlying(model)
        return cls(model, root, optimizers, Layout.of(root), tuple(n for n, _ in root.named_modules()),
                   any(is_dtensor(p) for p in root.parameters()))

    @property
    def optimizer(self) -> torch.optim.Optimizer | None:
        return self.optimizers[0] if self.optimizers else None

    def held(self, optimizers: list[torch.optim.Optimizer] | None = None) -> set[int]:
        """The ids of the parameters that ``optimizers`` (all of them by default) hold."""
        return set(map(id, chain.from_iterable(g["params"] for o in (
            self.optimizers if optimizers is None else optimizers) for g in o.param_groups)))

    def names_of(self, optimizer: torch.optim.Optimizer) -> list[str]:
        held = self.held([optimizer])
        return [n for n, p in self.root.named_parameters() if id(p) in held]

    def lrs(self) -> list[float]:
        return [float(g.get("lr", math.nan)) for o in self.optimizers for g in o.param_groups]


class Ranks:
    """The ranks a watch runs on: the process group, this rank and the world, whether the distributed
    checks run, the check-ins before each forward pass and each step (opened with the watch), the training
    forward passes counted and each rank's own time before the step's first collective."""

    def __init__(self, group: Any, distributed: bool | None, sharded: bool, timeout: float) -> None:
        initialised = dist.is_available() and dist.is_initialized()
        self.group = group
        self.world = dist.get_world_size(group) if initialised else 1
        self.rank = dist.get_rank(group) if initialised else 0
        self.distributed = self.world > 1 if distributed is None else distributed
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise InspectorError(f"timeout must be a number of seconds over 0, got {timeout!r}")
        self.timeout = timeout
        self.meeting: Meeting | None = None
        self.forwards = 0  # training forward passes (grad on, train mode) begun: every rank makes as many
        self.back = False  # a backward pass reached a training forward's output since the last forward began
        self.clock = ComputeClock(sharded)

    def open(self, model: dict[str, Any] | None = None) -> None:
        self.meeting = (Meeting(self.group, self.rank, self.world, self.timeout, model) if self.world > 1
                        else None)

    def check_in(self, kind: str, step: int) -> None:
        """Check in with the other ranks before a training forward pass (``"forward"``) or a step
        (``"step"``); raises :class:`~.ranks.RanksApart` where they are out of step."""
        if self.meeting is None:
            return
        back = self.back
        if kind == "forward":
            self.back = False
        began = time.perf_counter()
        self.meeting.check_in(kind, step, self.forwards, back)
        self.clock.wait(time.perf_counter() - began)
        if kind == "forward":
            self.forwards += 1

    def forwarded(self, output: Any) -> None:
        """A training forward pass ended: its backward, when it comes, is noted (a hook on the output's
        node, dropped with the graph)."""
        if self.meeting is None:
            return
        for t in floating(output)[:8]:
            node = t.grad_fn
            if node is not None:
                node.register_prehook(self._backward)

    def _backward(self, grad_outputs: Any) -> None:
        self.back = True

class Recorder:
    """Builds the run: each finding once per (code, where, rank), or once per episode
    (:func:`~inspector.utils.codes.recurs`), written to the run file and kept in ``findings``;
    :meth:`finish` freezes it into the :class:`WatchResult`. A code checked only every Nth step has not
    cleared before N steps pass without it."""

    def __init__(self, path: str, world: int, clear: int,
                 on_finding: Callable[[StepFinding], None] | None) -> None:
        self.path, self.world, self.on_finding = path, world, on_finding
        self.writer: RunWriter | None = None
        self.episodes = Episodes(recurs, clear)
        self.findings: list[StepFinding] = []
        self.captures: Captures | None = None

    def first_time(self, found: list[Finding], step: int, rank: int, quiet: bool = False) -> list[Finding]:
        """The findings of ``found`` that begin something at their (code, where, rank): seen for the first
        time, or back after they cleared; ``quiet``: only noted as seen."""
        if not found:  # nothing seen: nothing begins, nothing is noted (most steps)
            return []
        place = rank if self.world > 1 else 0
        fresh = group_findings((step, place, f) for f in found)  # one per (code, where) in this step
        new = []
        for _, _, f in self.episodes.starts((step, place, f) for _, _, f in fresh.values()):
            if quiet:
                continue
            new.append(f)
            sf = StepFinding(step, place, f.code, f.severity, f.where, f.message)
            self.findings.append(sf)
            if self.on_finding is not None:
                self.on_finding(sf)
        return new

    def would_start(self, step: int, rank: int, f: Finding) -> bool:
        return self.episodes.would_start(step, rank, f)

    def finish(self, steps: int, completed: bool) -> WatchResult:
        """Close the file and freeze what was recorded."""
        if self.writer is not None:
            self.writer.close()
        return WatchResult(self.path, steps, list(self.findings), self.captures, completed)


@dataclass
class StopControl:
    """Whether training should stop, gathered with every rank's numbers so every rank reads the same
    answer at the same step boundary.

    - ``on_error``: set once, before the watch opens, by whoever runs it (an integration's
      ``stop_on_error``); never reset.
    - ``requested``: set by this rank's code (``w.stop_requested = True``); goes out with this rank's
      numbers at each step until the run ends; never reset.
    - ``agreed``: set by the watch when any rank's gathered flag says stop; never reset.
    """

    on_error: bool = False
    requested: bool = False
    agreed: bool = False

    def flag(self, errors: bool) -> float:
        """This rank's stop flag for this step (its request, or an error of its own with ``on_error``)."""
        return float(self.requested or (self.on_error and errors))

    def gathered(self, flags: list[float]) -> None:
        self.agreed = self.agreed or any(f > 0 for f in flags)


@dataclass
class Scalars:
    """What ``w.log`` gave since the last step (floats, or 0-d tensors kept on their device): the step
    takes them (:meth:`take`), which empties them."""

    values: dict[str, Any] = field(default_factory=dict)

    def log(self, **scalars: Any) -> None:
        for k, v in scalars.items():
            if isinstance(v, torch.Tensor):
                if v.numel() != 1:
                    raise InspectorError(f"w.log({k}=...) takes a number or a one-element tensor, got shape "
                                         f"{tuple(v.shape)}")
                v = v.detach().reshape(())
            elif not isinstance(v, (int, float)):
                raise InspectorError(f"w.log({k}=...) takes a number or a tensor, got {type(v).__name__}")
            self.values[k] = v

    def get(self, name: str) -> Any:
        return self.values.get(name)

    def take(self) -> dict[str, Any]:
        out, self.values = self.values, {}
        return out


__all__ = ["Ranks", "Recorder", "Scalars", "StopControl", "Target", "WatchOptions"]
