"""What comes before the optimizer's step: its pre-step hook (a step given a closure measures when the
closure returns), the ranks' check-in before each training forward pass and step (:mod:`.ranks`), the
gradients taken early and the clip that reuses their norms. :class:`BeforeStep` holds these methods of
:class:`~.core.Watch`, which is made of it."""

from __future__ import annotations

import operator
from collections.abc import Callable
from itertools import compress
from typing import Any, cast

import torch
from torch import nn

from ..runfiles import StepFinding
from ..utils.findings import Finding
from .ranks import RanksApart
from .roles import Ranks, Target
from .steps import StepState

_LAYOUT = operator.attrgetter("layout")


class BeforeStep:
    """The watch's methods before a step's update (the attributes are the :class:`~.core.Watch`'s)."""

    state: StepState
    ranks: Ranks
    target: Target
    _pre_done: bool
    _in_step: bool
    _pre_step: Callable[[], None]
    _record_now: Callable[[Finding, int], None]

    def _step_starts(self, optimizer: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        """The optimizer's pre-step hook. A step given a closure (Lightning, LBFGS) computes its
        gradients inside it: the step's numbers are taken when the closure first returns."""
        self._in_step = True  # another optimizer's step inside this one (a wrapper's inner one) is this one
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)  # args[0]: the optimizer
        if closure is None:
            if not self._pre_done:  # else taken already (gradients_ready, before a clip)
                self._pre_step()
            return None
        self.state.closure = True

        def closure_then_measure() -> Any:
            out = closure()
            if not self._pre_done:
                with torch.no_grad():
                    self._pre_step()
            return out
        if "closure" in kwargs:
            return args, {**kwargs, "closure": closure_then_measure}
        return (args[0], closure_then_measure, *args[2:]), kwargs

    def _forward_starts(self, module: nn.Module, args: Any) -> None:
        """The model's forward pre-hook: a training forward pass checks in before its first collective."""
        if module.training and torch.is_grad_enabled():
            self._check_in("forward")

    def _check_in(self, kind: str) -> None:
        """Every rank at the same forward pass or step before its first collective (:mod:`.ranks`)."""
        if self.ranks.meeting is None:
            return
        try:
            self.ranks.check_in(kind, self.state.count)
        except RanksApart as apart:  # recorded on the rank(s) at fault; no collective was started
            for r in apart.ranks:
                self._record_now(apart.findings[r], r)
            first = apart.ranks[0]
            f = apart.findings[first]
            apart.finding = StepFinding(self.state.count, first, f.code, f.severity, f.where, f.message)
            raise

    def gradients_ready(self) -> None:
        """Take this step's gradient numbers now, before something changes the gradients ahead of the
        optimizer's step (a clip: the Trainer's integration calls it once the gradients are unscaled,
        so the run holds the pre-clip norm the Trainer logs); the step then does not take them again."""
        with torch.no_grad():
            self._pre_step()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False,
                        foreach: bool | None = None) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_`` over the watched model's parameters, from the gradient norms
        the watch takes for this step anyway: one pass over the gradients instead of two. Call it where
        the loop clips, after ``backward()`` (and after ``scaler.unscale_(optimizer)`` under AMP); the run
        then holds the pre-clip norms, and the step does not read the gradients again. Returns the total
        norm (a tensor, as torch's does).

        The 2-norm is shared: of plain tensors (one process, or DDP, whose gradients are already the same
        on every rank) as they are; of sharded DTensor gradients (FSDP2, tensor parallel) from the squares
        of the local pieces' norms summed over the ranks that hold the pieces, with one ``all_reduce`` per
        mesh group (as torch's does; the step then does not reduce the gradients' norms again). Another
        ``norm_type``, or sparse gradients, is torch's own ``clip_grad_norm_``, after the watch's pass:
        correct, at the cost of the second pass."""
        self.gradients_ready()
        grads, present = self.state.grads, self.state.has_grad  # those just measured
        params = cast("list[torch.Tensor]", list(compress(self.state.params, present)))  # with a gradient
        parts = self.state.grad_parts
        sparse = set(map(_LAYOUT, compress(grads, present))) - {torch.strided}
        if norm_type != 2.0 or not parts or sparse:
            return torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type, error_if_nonfinite, foreach)
        total = self.state.global_grad_total() if self.target.sharded else None
        if total is None:
            device = parts[0][1].device
            total = torch.stack([n.double().square().sum().to(device) for _, n in parts]).sum().sqrt().float()
        if error_if_nonfinite and not bool(torch.isfinite(total)):
            raise RuntimeError(f"The total norm of order {norm_type} for gradients from `parameters` is "
                               "non-finite, so it cannot be clipped. To disable this error and scale the "
                               "gradients by the non-finite norm anyway, set `error_if_nonfinite=False`")
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, total, foreach)
        return total


__all__ = ["BeforeStep"]
