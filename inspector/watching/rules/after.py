"""The checks after the optimizer's step, on this rank's numbers (:mod:`inspector.watching.rules`)."""


from __future__ import annotations

from typing import TYPE_CHECKING, cast

import numpy as np
import torch

from ...utils.codes import coded
from ...utils.findings import Finding
from ...utils.labels import module_label
from ..checks import OptimizerSteps, nonfinite_gradients
from ..clearing import GradientClearing
from ..detect import Detectors
from ..layout import has_norm
from ..numbers import NO_PRODUCER
from ..stepfindings import nonfinite_findings, written_findings

if TYPE_CHECKING:
    from ..events import At, Kit


PRODUCED = ("nonfinite-forward", "nonfinite-backward")
SPREAD = ("nonfinite-gradient", "nonfinite-parameter")


# -- after the step, on this rank's numbers ----------------------------------------------------
class WrittenWeights:
    """``nonfinite-parameter``: a parameter written outside the optimizer since the last step (its
    version or storage moved) holds NaN/Inf when this step's forward used it."""

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if not at.st.written:  # no such parameter (most steps)
            return found
        return found + written_findings(at.st, at.target.layout.parameters)


class Producers:
    """``nonfinite-forward`` / ``nonfinite-backward``: the step's trace (``nonfinite=True``) names the
    first module (or the batch) whose output turned NaN/Inf from finite inputs, and the module whose
    backward turned a finite output gradient into a non-finite input gradient. A step whose trace names
    neither (no producer: most steps, and every step without the trace) is passed over at once."""

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        if n.forward == NO_PRODUCER and n.backward == NO_PRODUCER:
            return found
        return found + nonfinite_findings(at.n, list(at.target.module_names), at.ranks.rank,
                                          at.ranks.world)


class ZeroGradientStep:
    """``zero-gradient-step``: the optimizer stepped while every trainable parameter it holds had no
    gradient or an all-zero one (``zero_grad()`` between ``backward()`` and ``step()``, a backward that
    never ran, a loss that does not depend on the parameters). A NaN/Inf gradient is not zero."""

    @classmethod
    def build(cls, kit: Kit) -> ZeroGradientStep | None:
        return cls() if kit.target.optimizer is not None else None

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n, held = at.n, at.held_mask
        if held is None or not len(held):
            return found
        stepped = held & ~n.no_grad  # held, with a gradient not all zero
        if len(stepped) == len(at.params):
            params = cast("list[torch.Tensor]", at.params)  # those with a gradient are there
            first = int(stepped.argmax())  # the first such parameter (0 when there is none): most steps
            if (stepped[first] and params[first].requires_grad) or any(
                    params[i].requires_grad for i in np.flatnonzero(stepped).tolist()):
                return found  # a trainable parameter the optimizer holds had a gradient
        trainable = held & np.array([p is not None and p.requires_grad for p in at.params], dtype=bool)
        if not trainable.any() or (~n.no_grad)[trainable].any():
            return found
        names = [at.target.layout.parameters[i] for i in np.flatnonzero(trainable)]
        absent = int((~n.has_grad[trainable]).sum())
        return found + [coded(
            "zero-gradient-step", names[0],
            f"the optimizer stepped while all {len(names)} trainable parameters it holds had "
            f"{'no gradient' if absent == len(names) else 'no gradient or an all-zero one'}: this step "
            "moved nothing. optimizer.zero_grad() between loss.backward() and optimizer.step() does this "
            "(call it before backward() or after step()); so does a backward that never ran or a loss "
            "that does not depend on the parameters")]


class GradientNorms:
    """``dead-gradient``: a parameter without a gradient (or an all-zero one) for ``window`` steps, or
    for two after a settled run of them; ``exploding-gradient``: a module's gradient norm over
    ``explode_factor`` times its running median and its noise (:class:`Detectors`). Not judged: the
    parameters no optimizer holds (not trained: ``not-in-optimizer`` names one that gets gradients), those
    of an optimizer given after the first that has not stepped once (a generator stepped every fifth
    step, a part trained from a later stage), and an all-zero bias of a module whose other
    parameters have gradients (the loss does not change with a shift of that module's output: a critic's
    mean difference, a normalisation after it)."""

    @classmethod
    def build(cls, kit: Kit) -> GradientNorms | None:
        return cls(kit.detectors, kit.optimizer_steps)

    def __init__(self, detectors: Detectors, steps: OptimizerSteps | None) -> None:
        self.detectors, self.steps = detectors, steps

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        # the parameters of an optimizer that has not stepped yet (after the first) are not judged
        unjudged = self.steps.waiting_mask(at.target.layout.parameters) if self.steps is not None else None
        held = at.held_mask  # a parameter no optimizer holds is not trained: whether its gradient is dead
        if held is not None and len(held) == len(n.has_grad) and not held.all():  # is not judged either
            unjudged = ~held if unjudged is None else unjudged | ~held
        out = self.detectors.gradients(n.param_grad, n.has_grad, n.module_grad, n.no_grad, unjudged)
        if out and any(f.code == "zero-gradient-step" for f in found):  # the cause of the missing gradients
            out = [f for f in out if f.code != "dead-gradient"]
        return found + out


class Loss:
    """``nonfinite-loss``: the logged loss is NaN/Inf and no producer (a module, the batch, a written
    weight) is named this step; ``loss-spike``: it is over ``loss_factor`` times its running median and
    its noise, and takes in this step's whole-model ``exploding-gradient``."""

    @classmethod
    def build(cls, kit: Kit) -> Loss | None:
        return cls(kit.detectors)

    def __init__(self, detectors: Detectors) -> None:
        self.detectors = detectors

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        return self.detectors.loss(float(n.loss), found) if n.loss_logged else found


class LearningRateRose:
    """No finding of its own: a ``loss-spike``, ``exploding-gradient`` or ``nonfinite-loss`` at a step where
    a param group's learning rate is ``factor`` (4) times or more its lowest non-zero value of the last
    ``steps`` (5) steps says so in its message (a scheduler or a hand-made change is then the likely
    cause)."""

    factor, steps = 4.0, 5
    codes = ("loss-spike", "exploding-gradient", "nonfinite-loss")

    def __init__(self) -> None:
        self.past: list[list[float]] = []  # the learning rates of the last steps, oldest first

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        lrs, past = at.lrs, self.past
        self.past = [*past[-(self.steps - 1):], lrs] if self.steps > 1 else [lrs]
        if not past or not any(f.code in self.codes for f in found):
            return found
        rose = []
        for g, lr in enumerate(lrs):
            low = min((p[g] for p in past if g < len(p) and p[g] > 0), default=0.0)
            if low > 0 and lr >= self.factor * low:
                rose.append((lr / low, g, low, lr))
        if not rose:
            return found
        ratio, g, low, lr = max(rose)
        said = (f"; the learning rate rose {ratio:.3g}x within the last {len(past)} steps (param group {g}: "
                f"{low:.3g} -> {lr:.3g}): that change, by a scheduler or by hand, is the likely cause")
        return [Finding(f.code, f.severity, f.where, f.message + said)
                if f.code in self.codes else f for f in found]


class NonfiniteGradients:
    """``nonfinite-gradient``: some modules' gradients hold NaN/Inf and nothing found this step
    explains it (a producer, a non-finite loss, a written weight). A step that counted no NaN/Inf
    gradient element (``nonfinite`` 0, the sum of every module's count) is passed over at once."""

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if not at.n.nonfinite:
            return found
        return found + nonfinite_gradients(at.n.module_nonfinite, at.target.layout.modules, found)


class UsedNonfiniteWeights:
    """Folds a ``nonfinite-forward`` / ``nonfinite-backward`` at a module whose own parameters held
    NaN/Inf at the last check step: those weights, named when they went non-finite, are the cause
    (every forward after a NaN step is NaN); the module is not a new producer. At a check step whose
    parameter and buffer norms are all finite no module owns such a parameter, so none is looked up."""

    def __init__(self) -> None:
        self.bad: set[str] = set()  # the modules (as findings name them) that own non-finite parameters

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if self.bad:
            found = [f for f in found if not (f.code in PRODUCED and f.where in self.bad)]
        if at.n.checked:
            names = at.target.layout.parameters
            self.bad = set() if at.n.weights_finite else {
                module_label(names[i].rpartition(".")[0]) for i in np.flatnonzero(~np.isfinite(weighed(at)))}
        return found


class NonfiniteWeights:
    """``nonfinite-parameter``: at a check step, a parameter's or buffer's values hold NaN/Inf after
    the step (not when a write outside the optimizer was named before the step). A check step whose
    norms are all finite numbers (most) holds none: nothing is looked up."""

    @classmethod
    def build(cls, kit: Kit) -> NonfiniteWeights | None:
        return cls(kit.detectors)

    def __init__(self, detectors: Detectors) -> None:
        self.detectors = detectors

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        if not n.checked or at.st.written or n.weights_finite:
            return found
        return found + self.detectors.parameters(weighed(at), n.buffer_norm, at.target.layout.buffers)


def weighed(at: At) -> np.ndarray:
    """The check step's parameter norms, 0 where no norm was taken (a parameter gone, emptied by a
    ``.data`` swap as FSDP and ZeRO-3 do, or sparse: it holds no value that could be NaN/Inf), so that
    NaN/Inf means values that are. Looked at only where a norm is NaN, so almost never."""
    norms = at.n.param_norm
    unknown = [i for i in np.flatnonzero(np.isnan(norms)).tolist() if not has_norm(at.params[i])]
    if unknown:
        norms = norms.copy()
        norms[unknown] = 0.0
    return norms


class GradientsUsed:
    """No finding: remembers each gradient this step used, for ``gradient-not-cleared`` at the next (with
    several optimizers, the first one's parameters and those no optimizer holds; another optimizer's
    are remembered at its own steps, :class:`~inspector.watching.rules.before.GradientsCleared`)."""

    @classmethod
    def build(cls, kit: Kit) -> GradientsUsed | None:
        return cls(kit.clearing)

    def __init__(self, clearing: GradientClearing) -> None:
        self.clearing = clearing

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n, params = at.n, at.st.params
        only = None
        if len(at.target.optimizers) > 1:  # the others' parameters: remembered at their own steps
            others = at.target.held(list(at.target.optimizers[1:]))
            only = {id(p) for p in params if p is not None and id(p) not in others}
        self.clearing.stepped(params, n.no_grad if n.whole else n.has_grad & n.no_grad,  # there, zero
                              None if at.st.closure else at.st.grads, only)
        return found
