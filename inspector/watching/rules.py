"""The watch's checks, one small class each, all with one interface: ``check(at, found) -> found``.

``at`` (:class:`~.table.At`) is what a check may read at one event of one step; ``found`` is this
event's findings so far, threaded from check to check in the order of
:data:`~.table.WATCH_CHECKS` (a check may add to it, and a few fold what they explain). A check that
holds hooks or a starting state sets them up in ``attach(at, stack)``, pushing what undoes them on the
exit stack the watch closes. Each class's docstring says when it fires; the severity of every finding
comes from :data:`~inspector.utils.codes.CODES`.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..aliases import compare_ties, snapshot_ties
from ..runfiles import StepFinding
from ..sharding.findings import ranks_of
from ..utils.codes import coded, lead_ranks
from ..utils.findings import Finding
from ..utils.labels import ROOT_LABEL, listed, module_label
from .checks import (
    GradientClearing,
    OptimizerSteps,
    Progress,
    TrainingMode,
    failure_finding,
    frozen_findings,
    nonfinite_gradients,
    replaced_findings,
)
from .detect import Detectors, not_in_optimizer
from .layout import current, fused_norms, to_host
from .ranks import RanksApart, slow_ranks
from .steps import nonfinite_findings, written_findings

if TYPE_CHECKING:
    from .events import At, ByRank, Kit, Placed

PRODUCED = ("nonfinite-forward", "nonfinite-backward")
SPREAD = ("nonfinite-gradient", "nonfinite-parameter")


# -- when the watch opens -----------------------------------------------------------------------
class FrozenParameters:
    """``frozen-parameters``: when the watch opens, some parameters do not require grad (one finding
    naming their modules)."""

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        return found + frozen_findings(at.target.root)


class UnheldAtOpen:
    """``not-in-optimizer``: when the watch opens, a parameter requires grad and no param group of
    the optimizers holds it."""

    @classmethod
    def build(cls, kit: Kit) -> UnheldAtOpen | None:
        return cls() if kit.target.optimizer is not None else None

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        return found + not_in_optimizer(at.target.layout.parameters, at.params, at.target.held())


# -- before the optimizer applies the step -----------------------------------------------------
class EvalMode:
    """``eval-mode-module``: at a step, a BatchNorm / InstanceNorm (with running statistics) / Dropout
    (p > 0) is in eval mode while its parent's parameters are not all frozen and, for a norm layer,
    its own affine parameters are not all frozen (the whole model in eval mode: one finding at the
    root)."""

    @classmethod
    def build(cls, kit: Kit) -> EvalMode | None:
        return cls(TrainingMode(kit.target.root))

    def __init__(self, modes: TrainingMode) -> None:
        self.modes = modes

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        return found + self.modes.findings()


class GradientsCleared:
    """``gradient-not-cleared``: a parameter of an optimizer that stepped since the last step holds,
    at this step, the very gradient the last step used, added onto by this step's backward (same
    tensor, version moved by exactly the add). Hooks every trainable parameter (again at each check
    step, for parameters swapped in)."""

    @classmethod
    def build(cls, kit: Kit) -> GradientsCleared | None:
        return cls(kit.clearing, kit.optimizer_steps)

    def __init__(self, clearing: GradientClearing, steps: OptimizerSteps | None) -> None:
        self.clearing, self.steps = clearing, steps

    def attach(self, at: At, stack: ExitStack) -> None:
        self.clearing.attach(at.params)
        stack.callback(self.clearing.remove)

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        steps = self.steps
        # the optimizers that stepped since the last step: read before OptimizerStepped resets the counts
        held = (lambda: at.target.held(steps.active(at.step))) if steps is not None else set
        out = found + self.clearing.findings(at.target.layout.parameters, at.params, held)
        if at.check and at.target.optimizer is not None:
            self.clearing.attach(at.params)
        return out


class Membership:
    """``not-in-optimizer`` at each check step for a trainable parameter no param group holds; after
    step 0, two or more at once are one ``parameters-replaced`` (``load_state_dict(assign=True)``,
    ``.to()``, a module swapped in)."""

    @classmethod
    def build(cls, kit: Kit) -> Membership | None:
        return cls() if kit.target.optimizer is not None else None

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if not at.check or at.held is None:
            return found
        return found + replaced_findings(not_in_optimizer(at.target.layout.parameters, at.params, at.held),
                                         at.step)


class Unfrozen:
    """``not-in-optimizer`` at a check step for a parameter frozen when the watch opened (so not watched)
    that now requires grad while no param group holds it: a part unfrozen mid-run and never added to
    the optimizer (``add_param_group``) does not train."""

    @classmethod
    def build(cls, kit: Kit) -> Unfrozen | None:
        return cls() if kit.target.optimizer is not None else None

    def attach(self, at: At, stack: ExitStack) -> None:
        self.frozen = [(n, p) for n, p in at.target.root.named_parameters() if not p.requires_grad]
        self.said: set[str] = set()

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if not at.check or at.held is None or not self.frozen:
            return found
        now = [n for n, p in self.frozen if p.requires_grad and id(p) not in at.held and n not in self.said]
        if not now:
            return found
        self.said.update(now)
        modules = list(dict.fromkeys(n.rpartition(".")[0] for n in now))
        return found + [coded(
            "not-in-optimizer", now[0],
            f"{len(now)} parameter(s) of {listed(modules)} were frozen when the watch started and now "
            "require grad, but no param group of the optimizer holds them: they never change. Add them with "
            "optimizer.add_param_group({'params': [...], 'lr': ...}) when you unfreeze them")]


class OptimizerStepped:
    """``optimizer-not-stepped``: one of several optimizers has not stepped by the first one's second
    step, or, having stepped, misses as many steps as :meth:`OptimizerSteps.findings` allows."""

    @classmethod
    def build(cls, kit: Kit) -> OptimizerStepped | None:
        return cls(kit.optimizer_steps) if kit.optimizer_steps is not None else None

    def __init__(self, steps: OptimizerSteps) -> None:
        self.steps = steps

    def attach(self, at: At, stack: ExitStack) -> None:
        self.steps.attach([at.target.names_of(o) for o in at.target.optimizers])
        stack.callback(self.steps.remove)

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        return found + self.steps.findings(at.step)


class TiesKept:
    """``tie-broken`` / ``tie-weakened`` at a check step when the objects behind the parameter names
    are not those at the last check and a tie the model had when the watch opened is gone."""

    def attach(self, at: At, stack: ExitStack) -> None:
        root = at.target.root
        self.ties = snapshot_ties(root)
        self.names = tuple(n for n, _ in root.named_parameters(remove_duplicate=False))
        self.ids = self._ids(root)

    def _ids(self, root: torch.nn.Module) -> tuple[int, ...]:
        """The object behind every parameter name, aliases included (read from the owners' registries)."""
        return tuple(id(p) for p in current(root, self.names))

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if not at.check:
            return found
        ids = self._ids(at.target.root)
        if ids == self.ids:
            return found
        self.ids = ids
        return found + compare_ties(self.ties, at.target.root)


# -- once the step's gradients are measured, before the optimizer step (collectives allowed) ----
class ReplicasAgree:
    """The distributed step check (:func:`inspector.distributed.check_step`) at each check step with
    the distributed checks on: ``replica-drift``, ``gradient-not-synchronized``, ``gradient-far-off``,
    ``shard-imbalance``, ``nonfinite-*`` from every rank's gathered columns (the same on every rank;
    placed on the row of the rank each is about once the numbers are gathered)."""

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if not (at.check and at.ranks.distributed):
            return found
        from ..distributed import check_step  # here: inspector.distributed re-exports read_run

        layout = at.target.layout
        norms = torch.zeros(len(layout.parameters), dtype=torch.float64)
        for idx, part in at.st.grad_parts:
            norms[torch.from_numpy(idx)] = part.to("cpu", torch.float64)
        return found + check_step(at.target.model, at.step, path=None, group=at.ranks.group, loss=at.loss,
                                  timeout=at.ranks.timeout, grad_norms=(layout.parameters, norms)).findings


# -- after the step, on this rank's numbers ----------------------------------------------------
class WrittenWeights:
    """``nonfinite-parameter``: a parameter written outside the optimizer since the last step (its
    version or storage moved) holds NaN/Inf when this step's forward used it."""

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        return found + written_findings(at.st, at.target.layout.parameters)


class Producers:
    """``nonfinite-forward`` / ``nonfinite-backward``: the step's trace (``nonfinite=True``) names the
    first module (or the batch) whose output turned NaN/Inf from finite inputs, and the module whose
    backward turned a finite output gradient into a non-finite input gradient."""

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
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
        trainable = held & np.array([p is not None and p.requires_grad for p in at.params], dtype=bool)
        if not trainable.any() or (n.has_grad & (n.param_grad != 0))[trainable].any():
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
    ``explode_factor`` times its running median and its noise (:class:`Detectors`)."""

    @classmethod
    def build(cls, kit: Kit) -> GradientNorms | None:
        return cls(kit.detectors)

    def __init__(self, detectors: Detectors) -> None:
        self.detectors = detectors

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        out = self.detectors.gradients(n.param_grad, n.has_grad, n.module_grad)
        if any(f.code == "zero-gradient-step" for f in found):  # the cause of the missing gradients
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
    explains it (a producer, a non-finite loss, a written weight)."""

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        return found + nonfinite_gradients(at.n.module_nonfinite, at.target.layout.modules, found)


class UsedNonfiniteWeights:
    """Folds a ``nonfinite-forward`` / ``nonfinite-backward`` at a module whose own parameters held
    NaN/Inf at the last check step: those weights, named when they went non-finite, are the cause
    (every forward after a NaN step is NaN); the module is not a new producer."""

    def __init__(self) -> None:
        self.bad: set[str] = set()  # the modules (as findings name them) that own non-finite parameters

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if self.bad:
            found = [f for f in found if not (f.code in PRODUCED and f.where in self.bad)]
        n = at.n
        if n.checked:
            names = at.target.layout.parameters
            self.bad = {module_label(names[i].rpartition(".")[0]) for i in np.flatnonzero(~np.isfinite(
                n.param_norm)) if at.params[i] is not None}
        return found


class NonfiniteWeights:
    """``nonfinite-parameter``: at a check step, a parameter's or buffer's values hold NaN/Inf after
    the step (not when a write outside the optimizer was named before the step)."""

    @classmethod
    def build(cls, kit: Kit) -> NonfiniteWeights | None:
        return cls(kit.detectors)

    def __init__(self, detectors: Detectors) -> None:
        self.detectors = detectors

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        if not n.checked or at.st.written:
            return found
        return found + self.detectors.parameters(n.param_norm, n.buffer_norm, at.target.layout.buffers)


class Updates:
    """``no-update``: every learning rate 0 for two steps, or no parameter an optimizer holds with a
    finite non-zero gradient changed its norm for two check steps."""

    @classmethod
    def build(cls, kit: Kit) -> Updates | None:
        return cls(kit.target.layout.parameters)

    def __init__(self, names: tuple[str, ...]) -> None:
        self.progress = Progress(names)

    def attach(self, at: At, stack: ExitStack) -> None:
        if at.target.sharded:  # a sharded model's norms are global only once stepped
            return
        start = np.full(len(at.params), np.nan)
        for idx, part in fused_norms(at.params):
            start[idx] = to_host([part])[0]
        self.progress = Progress(at.target.layout.parameters, start=start)

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        return found + self.progress.step(at.lrs, n.param_norm if n.checked else None, n.param_grad,
                                          n.has_grad, bool(n.skipped), at.held_mask)


class IdleGroups:
    """``no-update``: a param group's learning rate has been 0 for two steps while another group's is
    not, and the group's parameters have non-zero gradients: that part of the model never trains."""

    window = 2

    @classmethod
    def build(cls, kit: Kit) -> IdleGroups | None:
        return cls() if kit.target.optimizer is not None else None

    def __init__(self) -> None:
        self.zero: list[int] = []  # steps in a row at lr 0, per param group (all optimizers, in order)

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        lrs = at.lrs
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
    parameters only, made when their norms first stay equal."""

    window = 3

    @classmethod
    def build(cls, kit: Kit) -> StillModules | None:
        return cls() if kit.target.optimizer is not None else None

    def __init__(self) -> None:
        self.last: np.ndarray | None = None
        # module -> [check steps in a row it stood still, its parameters' indices, their copies, others moved]
        self.still: dict[str, list[Any]] = {}

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        if not n.checked:
            return found
        norm = n.param_norm
        last, self.last = self.last, np.array(norm, copy=True)
        if last is None or len(last) != len(norm):
            return found
        moving = n.has_grad & np.isfinite(n.param_grad) & (n.param_grad > 0) & np.isfinite(norm)
        if at.held_mask is not None and len(at.held_mask) == len(moving):
            moving &= at.held_mask
        same = moving & (norm == last)
        if not same.any():
            self.still.clear()
            return found
        names, lr = at.target.layout.parameters, self._lrs(at)
        parts: dict[str, list[int]] = {}
        for i in np.flatnonzero(moving):
            p = at.params[i]
            if p is not None and lr.get(id(p), 0.0) > 0:
                parts.setdefault(names[i].rpartition(".")[0], []).append(int(i))
        standing = {m: idx for m, idx in parts.items() if same[idx].all()}
        out = []
        for module, idx in standing.items():
            elsewhere = bool((moving & ~same).any()) and not (moving & ~same)[idx].any()
            kept = self.still.get(module)
            if kept is None or kept[1] != idx:
                self.still[module] = [1, idx, [_held(at, i).detach().clone() for i in idx], elsewhere]
                continue
            kept[0] += 1
            kept[3] = kept[3] or elsewhere
            if kept[0] < self.window:
                continue
            del self.still[module]
            if kept[3] and all(torch.equal(c, _held(at, i)) for c, i in zip(kept[2], idx, strict=True)):
                out.append(self._finding(at, module, idx, lr))
        for module in [m for m in self.still if m not in standing]:
            del self.still[module]
        return found + out

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
        for o in at.target.optimizers[:1]:
            for g in o.param_groups:
                for p in g["params"]:
                    out.setdefault(id(p), float(g.get("lr", 0.0)))
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
        self.clearing.stepped(at.st.params, n.has_grad & (n.param_grad == 0))
        return found


# -- when the GradScaler skipped a step (its update() ran with no optimizer step since the last) -
class ScalerSkips:
    """``scaler-skipping``: the AMP ``GradScaler`` given as ``scaler=`` skipped ``in_a_row`` steps in a row
    (its ``update()`` ran that many times with no optimizer step between): every step's gradients
    overflow and the model no longer trains. Or, once, its scale fell under ``floor`` at a skipped step:
    steps skipped on and off halve it faster than it grows back (it doubles only after 2,000 clean
    steps), so the overflow is not the scale's to settle. The usual early skips, while the scale settles
    from its initial value, are fewer and end far above the floor."""

    in_a_row = 10
    floor = 1.0

    @classmethod
    def build(cls, kit: Kit) -> ScalerSkips | None:
        scaler = kit.options.scaler
        return cls(scaler) if scaler is not None and callable(getattr(scaler, "get_scale", None)) else None

    def __init__(self, scaler: Any) -> None:
        self.scaler = scaler
        self.skips, self.at_step, self.total = 0, -1, 0
        self.first_scale = math.nan
        self.floored = False

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        self.skips = self.skips + 1 if at.step == self.at_step + 1 else 1  # each skipped step is a row
        self.at_step = at.step
        self.total += 1
        scale = float(self.scaler.get_scale())  # a host sync, on a skipped step only
        if self.skips == 1:
            self.first_scale = scale
        if self.skips == self.in_a_row:
            self.floored = True  # said: the scale's fall that follows is the same overflow
            return found + [coded(
                "scaler-skipping", ROOT_LABEL,
                f"the GradScaler skipped the last {self.skips} optimizer steps in a row (its scale fell from "
                f"{self.first_scale:.3g} to {scale:.3g}): the gradients hold Inf/NaN at every step, so "
                "optimizer.step() is never called and the model no longer trains. Find the overflow (watch "
                "with nonfinite=True names the module), lower the learning rate, or train in bfloat16")]
        if scale < self.floor and not self.floored:
            self.floored = True
            return found + [coded(
                "scaler-skipping", ROOT_LABEL,
                f"the GradScaler's scale fell to {scale:.3g}, under {self.floor:g}: it skipped "
                f"{self.total} of the {at.step + 1} steps so far, on and off, and halves at each skip faster "
                "than it grows back, so an overflow comes back whatever the scale. Find it (watch with "
                "nonfinite=True names the module), lower the learning rate, or train in bfloat16")]
        return found


# -- when an optimizer the watch was not given steps ------------------------------------------------
class OptimizerLost:
    """``optimizer-lost``: an optimizer the watch was not given stepped parameters that the watched
    optimizers hold, outside their own step (a new optimizer built mid-run and not handed over with
    ``w.use_optimizer``): the watch no longer sees the steps. Said once."""

    @classmethod
    def build(cls, kit: Kit) -> OptimizerLost | None:
        return cls() if kit.target.optimizer is not None else None

    def __init__(self) -> None:
        self.said = False

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if self.said:
            return found
        self.said = True
        names = at.target.names_of(at.other)
        held = at.target.held()
        ours = [n for n, p in at.target.root.named_parameters() if id(p) in held and n in set(names)]
        return found + [coded(
            "optimizer-lost", ours[0] if ours else ROOT_LABEL,
            f"another optimizer ({type(at.other).__name__}, holding {len(names)} parameters, {len(ours)} of "
            f"them the watched optimizer's) stepped after step {at.step}: a new optimizer built mid-run. The "
            "watch follows the optimizer it was given, which no longer steps, so it lost track: the run "
            "file records no step from here. Hand it the new one with w.use_optimizer(new_optimizer)")]


# -- once every rank's numbers are gathered (``found`` per rank) --------------------------------
class SlowRanks:
    """``slow-rank``: a rank's time before the step's first collective is 1 s or more and 3x or more
    the median of the other ranks'."""

    def __call__(self, at: At, found: ByRank) -> ByRank:
        for r, f in slow_ranks([n.compute for n in at.numbers_all]):
            found.found[r].append(f)
        return found


class ReplicaFindingsPlaced:
    """No finding of its own: places the distributed step check's findings (:class:`ReplicasAgree`) on
    the row of the first rank each is about (rank 0 for the whole group)."""

    def __call__(self, at: At, found: ByRank) -> ByRank:
        for f in at.measured:
            about = ranks_of(f)
            found.found[about[0] if about and about[0] < len(found.found) else 0].append(f)
        return found


class SpreadFolded:
    """Folds, under several ranks, at a step where a rank names a producer (``nonfinite-forward`` /
    ``nonfinite-backward``), every rank's ``nonfinite-gradient`` / ``nonfinite-parameter``: the
    reduction spread the producer's NaN/Inf to them. They are noted as seen, not reported."""

    def __call__(self, at: At, found: ByRank) -> ByRank:
        if at.ranks.world == 1 or not any(f.code in PRODUCED for fs in found.found for f in fs):
            return found
        for r, fs in enumerate(found.found):
            found.quiet[r] += [f for f in fs if f.code in SPREAD]
            found.found[r] = [f for f in fs if f.code not in SPREAD]
        return found


class OriginFirst:
    """No finding of its own: at a step where a rank's batch, forward, backward or loss went NaN/Inf
    (``nonfinite-forward``, ``nonfinite-backward``, ``nonfinite-loss``), that rank's findings are recorded
    first, then the other ranks' (the NaN/Inf the gradient reduction brought them): the cause leads the
    run file, ``verdict()`` and the stop on the first error. Only what is recorded at this step counts
    (a NaN loss that goes on from an earlier step does not lead), so every rank orders alike."""

    def __call__(self, at: At, found: ByRank) -> ByRank:
        starts = at.starts or (lambda rank, f: True)
        found.order = lead_ranks([[f.code for f in fs if starts(r, f)] for r, fs in enumerate(found.found)])
        return found


# -- when the watch closes (``found`` as (rank, finding) pairs, in the order they are recorded) -
class RankFailures:
    """``run-failed`` for another rank: it raised (its exception, at its step), another rank's check-in
    named it out of step, or it vanished without a word; recorded by rank 0 (not again for the ranks a
    :class:`RanksApart` of its own already named)."""

    def __call__(self, at: At, found: list[Placed]) -> list[Placed]:
        meeting = at.ranks.meeting
        if meeting is None:
            return found
        skip = set(at.error.ranks) if isinstance(at.error, RanksApart) else set()
        return found + [(r, f) for r, f in meeting.failures(at.step, at.error).items() if r not in skip]


class RunFailed:
    """``run-failed``: an exception ended the watched block (its type and message, at its step);
    not for a stop the watch itself asked for (an error that carries its finding)."""

    def __call__(self, at: At, found: list[Placed]) -> list[Placed]:
        error = at.error
        if error is None or isinstance(getattr(error, "finding", None), StepFinding):
            return found
        return found + [(at.ranks.rank, failure_finding(error, at.step))]
