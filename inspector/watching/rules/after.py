"""The checks after the optimizer's step, on this rank's numbers (:mod:`inspector.watching.rules`)."""


from __future__ import annotations

from contextlib import ExitStack
from itertools import repeat
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from ...utils.codes import coded
from ...utils.findings import Finding
from ...utils.labels import listed, module_label
from ..checks import (
    GradientClearing,
    OptimizerSteps,
    Progress,
    nonfinite_gradients,
)
from ..detect import Detectors
from ..flags import _piece
from ..layout import fused_norms, has_norm, to_host
from ..numbers import NO_PRODUCER
from ..steps import nonfinite_findings, written_findings

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
        self.names: set[str] = set()
        self.unjudged: np.ndarray | None = None

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        # the parameters of an optimizer that has not stepped yet (after the first) are not judged
        names = self.steps.waiting() if self.steps is not None and len(self.steps.optimizers) > 1 else set()
        if names != self.names:
            self.names = names
            self.unjudged = np.isin(np.asarray(at.target.layout.parameters, dtype=object),
                                    list(names)) if names else None
        unjudged = self.unjudged
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


class Updates:
    """``no-update``: every learning rate 0 for two steps, or no parameter an optimizer holds with a
    finite non-zero gradient changed its norm for two check steps."""

    def attach(self, at: At, stack: ExitStack) -> None:
        start = None  # a sharded model's norms are global only once stepped
        if not at.target.sharded:
            start = np.full(len(at.params), np.nan)
            for idx, part in fused_norms(at.params):
                start[idx] = to_host([part])[0]
        self.progress = Progress(start=start)

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        return found + self.progress.step(at.lrs, n.param_norm if n.checked else None, n.param_grad,
                                          n.has_grad, bool(n.skipped), at.held_mask,
                                          n.moving if n.checked else None)


class IdleGroups:
    """``no-update``: a param group's learning rate has been 0 for two steps while another group's is
    not, and the group's parameters have non-zero gradients: that part of the model never trains. A step
    with no lr at 0, after one with none, counts nothing: it is passed over at once."""

    window = 2

    @classmethod
    def build(cls, kit: Kit) -> IdleGroups | None:
        return cls() if kit.target.optimizer is not None else None

    def __init__(self) -> None:
        self.zero: list[int] = []  # steps in a row at lr 0, per param group (all optimizers, in order)

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        lrs = at.lrs
        if len(self.zero) == len(lrs) and 0 not in lrs and not any(self.zero):
            return found  # no lr at 0, now or at the last step: nothing counts (most steps)
        if len(self.zero) != len(lrs):
            self.zero = [0] * len(lrs)
        self.zero = [z + 1 if lr == 0 else 0 for z, lr in zip(self.zero, lrs, strict=True)]
        if not any(lr > 0 for lr in lrs):
            return found  # every lr at 0: Updates names it
        out = []
        for g in (i for i, z in enumerate(self.zero) if z == self.window):
            names = self._moving(at, g)
            if names:
                modules = list(dict.fromkeys(n.rpartition(".")[0] for n in names))
                out.append(coded(
                    "no-update", names[0],
                    f"param group {g} (holding {len(names)} parameters with a gradient, of "
                    f"{listed(modules)}) has had lr 0 for {self.window} steps while other groups train: "
                    "its parameters never change. Check that group's lr and the scheduler's lambda for it "
                    "(freeze a part with requires_grad_(False) instead)"))
        return found + out

    @staticmethod
    def _moving(at: At, group: int) -> list[str]:
        """The parameters of flat param group ``group`` with a non-zero gradient this step."""
        groups = [g for o in at.target.optimizers for g in o.param_groups]
        ids = {id(p) for p in groups[group]["params"]}
        n = at.n
        return [at.target.layout.parameters[i] for i, p in enumerate(at.params)
                if p is not None and id(p) in ids and n.has_grad[i] and n.param_grad[i] != 0]


class StillModules:
    """``no-update``: for ``window`` check steps in a row, every parameter of one module that an optimizer
    holds at an lr above 0 (the first optimizer given: its steps are the steps), with a finite non-zero
    gradient, kept its values exactly (its norm unchanged
    at each step, then its values compared with a copy taken when it first stood still), while
    parameters elsewhere moved: that module never trains (an update below its weights' precision,
    bfloat16 weights with a small lr, or its weights put back after each step). A whole model that
    stands still is ``Updates``'s; a group at lr 0 is ``IdleGroups``'s. The copy is of that module's
    parameters only, made when their norms first stay equal; of a sharded parameter, this rank's piece
    (compared here, with no collective: the norms that lead to it are global, so each rank holding a piece
    compares its own). Under one optimizer with every lr above 0, the modules that stand are told from
    the parameters' owners alone (those with a parameter whose norm stayed and none that moved), without
    each parameter's learning rate."""

    window = 3

    @classmethod
    def build(cls, kit: Kit) -> StillModules | None:
        return cls() if kit.target.optimizer is not None else None

    def __init__(self) -> None:
        self.last: np.ndarray | None = None
        self.owned: list[list[int]] | None = None
        self.masks = b""  # the last step's masks (same, moved), and the modules they made stand (read only)
        self.standing: dict[str, list[int]] = {}
        # module -> [check steps in a row it stood still, its parameters' indices, their copies, others moved]
        self.still: dict[str, list[Any]] = {}

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        if not n.checked:
            return found
        norm = n.param_norm
        last, self.last = self.last, norm.copy()
        if last is None or len(last) != len(norm):
            return found
        moving = n.moving  # shared by the rows of the step: not written in place
        if at.held_mask is not None and len(at.held_mask) == len(moving):
            moving = moving & at.held_mask
        same = moving & (norm == last)
        if not np.count_nonzero(same):
            self.still.clear()
            return found
        layout = at.target.layout
        lr: dict[int, float] | None = None
        moved: np.ndarray | None = None
        standing: dict[str, list[int]]  # in the order of each module's first counted parameter
        if self._simple(at, moving):  # the parameters that count are those moving
            moved = moving & ~same
            key = same.tobytes() + moved.tobytes()  # the same masks as at the last step: the same modules
            if key != self.masks:
                owner = layout.owner
                stood = set(owner[same].tolist()) - set(owner[moved].tolist())
                flags = moving.tolist()
                self.masks, self.standing = key, dict(sorted(
                    ((layout.modules[m], [i for i in self._owned(layout)[m] if flags[i]]) for m in stood),
                    key=lambda item: item[1][0]))
            standing = self.standing
        else:
            lr = self._lrs(at)
            params = at.params
            # the parameters that count: moving, at an lr above 0; a module stands when all of its own stood
            rates = np.fromiter(map(lr.get, map(id, params), repeat(0.0)), dtype=np.float64,
                                count=len(params))
            counted = np.flatnonzero(moving & (rates > 0))
            owner = layout.owner[counted]
            width = len(layout.modules)
            tally = np.bincount(owner, weights=same[counted], minlength=width)
            whole = np.bincount(owner, minlength=width)
            kept_idx = counted[((whole > 0) & (tally == whole))[owner]]
            standing = {}
            for i, m in zip(kept_idx.tolist(), layout.owner[kept_idx].tolist(), strict=True):
                standing.setdefault(layout.modules[m], []).append(i)
        if not standing:
            self.still.clear()
            return found
        # parameters that moved: none of a standing module's (all of its own stood still), so elsewhere
        elsewhere = bool(np.count_nonzero(moved if moved is not None else moving & ~same))
        out = []
        for module, idx in standing.items():
            kept = self.still.get(module)
            if kept is None or kept[1] != idx:
                self.still[module] = [1, idx, [_piece(_held(at, i)).clone() for i in idx], elsewhere]
                continue
            kept[0] += 1
            kept[3] = kept[3] or elsewhere
            if kept[0] < self.window:
                continue
            del self.still[module]
            pieces = (_piece(_held(at, i)) for i in idx)
            if kept[3] and all(map(torch.equal, kept[2], pieces)):
                out.append(self._finding(at, module, idx, lr if lr is not None else self._lrs(at)))
        for module in [m for m in self.still if m not in standing]:
            del self.still[module]
        return found + out

    @staticmethod
    def _simple(at: At, moving: np.ndarray) -> bool:
        """One optimizer, holding every parameter counted here (``moving`` is masked by what it holds), and
        every lr above 0: then the parameters that count are ``moving``, and no learning rate need be
        looked up per parameter."""
        held = at.held_mask
        return (len(at.target.optimizers) == 1 and held is not None and len(held) == len(moving)
                and all(lr > 0 for lr in at.lrs))

    def _owned(self, layout: Any) -> list[list[int]]:
        """Each module's parameter indices, in order (the layout does not change while the watch runs)."""
        if self.owned is None:
            self.owned = [[] for _ in layout.modules]
            for i, m in enumerate(layout.owner.tolist()):
                self.owned[m].append(i)
        return self.owned

    def _finding(self, at: At, module: str, idx: list[int], lr: dict[int, float]) -> Finding:
        n, names = at.n, at.target.layout.parameters
        grad = float(np.sqrt(sum(float(n.param_grad[i]) ** 2 for i in idx)))
        rates = sorted({lr[id(at.params[i])] for i in idx})
        dtypes = sorted({str(_held(at, i).dtype).removeprefix("torch.") for i in idx})
        return coded(
            "no-update", names[idx[0]],
            f"{module_label(module)}'s weights ({listed(dtypes)}) have not changed in {self.window} "
            f"steps although their gradient is non-zero (norm {grad:.3g}) and their lr is "
            f"{listed([f'{r:g}' for r in rates])}, while the rest of the model trains: each update is below "
            "the weights' precision (bfloat16 weights: keep float32 master weights, or raise this part's "
            "lr), or something puts the weights back after each step")

    @staticmethod
    def _lrs(at: At) -> dict[int, float]:
        """The learning rate of each parameter the first optimizer holds, by id (its param group's): the
        first optimizer's steps are the watch's steps; another may step less often (a GAN's generator
        every fifth step), so its parameters standing still between its steps say nothing."""
        out: dict[int, float] = {}
        for o in at.target.optimizers[:1]:  # written last to first, so a parameter's first group wins
            for g in reversed(o.param_groups):
                if g["params"]:
                    out.update(zip(map(id, reversed(g["params"])), repeat(float(g.get("lr", 0.0)))))
        return out


def _held(at: At, i: int) -> torch.Tensor:
    """Parameter ``i`` of this step, one the caller knows is there."""
    p = at.params[i]
    assert p is not None
    return p


class GradientsUsed:
    """No finding: remembers each gradient this step used, for ``gradient-not-cleared`` at the next."""

    @classmethod
    def build(cls, kit: Kit) -> GradientsUsed | None:
        return cls(kit.clearing)

    def __init__(self, clearing: GradientClearing) -> None:
        self.clearing = clearing

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        self.clearing.stepped(at.st.params, n.no_grad if n.whole else n.has_grad & n.no_grad)  # there, zero
        return found
