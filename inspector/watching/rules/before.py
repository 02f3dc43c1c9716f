"""The checks of the watch's first events: when it opens, before the optimizer applies a step, and once
the step's gradients are measured (:mod:`inspector.watching.rules`)."""


from __future__ import annotations

from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...aliases import compare_ties, snapshot_ties
from ...utils.codes import coded
from ...utils.findings import Finding
from ...utils.labels import listed
from ..checks import (
    OptimizerSteps,
    TrainingMode,
    frozen_findings,
    replaced_findings,
)
from ..clearing import GradientClearing
from ..detect import not_in_optimizer
from ..layout import current

if TYPE_CHECKING:
    from ..events import At, Kit


# -- when the watch opens -----------------------------------------------------------------------
class FrozenParameters:
    """``frozen-parameters``: when the watch opens, some parameters do not require grad (one finding
    naming their modules)."""

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        return found + frozen_findings(at.target.root)


class UnheldAtOpen:
    """``not-in-optimizer``: when the watch opens, a parameter requires grad, holds a gradient (a
    backward ran before the watch opened) and no param group of the optimizers holds it. One without a
    gradient yet is judged at the first step (:class:`Membership`)."""

    @classmethod
    def build(cls, kit: Kit) -> UnheldAtOpen | None:
        return cls() if kit.target.optimizer is not None else None

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        unheld = not_in_optimizer(at.target.layout.parameters, at.params, at.target.held())
        if not unheld:
            return found
        graded = _with_gradients(at)  # once, not once per parameter named
        return found + [f for f in unheld if f.where in graded]


def _with_gradients(at: At) -> set[str]:
    """The names of this step's parameters that hold a gradient."""
    return {n for n, p in zip(at.target.layout.parameters, at.params, strict=True)
            if p is not None and p.grad is not None}


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
        if not self.modes.modules:  # no module whose mode matters (most models without BatchNorm or Dropout)
            return found
        return found + self.modes.findings()


class GradientsCleared:
    """``gradient-not-cleared``: a parameter of the optimizer about to step holds the very gradient the
    last step used, added onto by a backward since (same tensor, version moved by exactly the add).
    The first optimizer's parameters are judged at the step; another optimizer's at its own steps (its
    pre-step hook, against what its own last step used; named at the next step), so a generator whose
    gradients a critic's backward adds onto between its steps, and which clears them before its own
    backward, is not named. Hooks every trainable parameter (again at each check step, for parameters
    swapped in), and the model's forward, whose end may stand those hooks down for the step
    (:class:`~inspector.watching.clearing.GradientClearing`)."""

    @classmethod
    def build(cls, kit: Kit) -> GradientsCleared | None:
        return cls(kit.clearing)

    def __init__(self, clearing: GradientClearing) -> None:
        self.clearing = clearing
        self.later: list[Finding] = []  # found at another optimizer's step, named at the next step

    def attach(self, at: At, stack: ExitStack) -> None:
        self.clearing.attach(at.params)
        stack.callback(self.clearing.remove)
        clearing = self.clearing
        stack.callback(at.target.root.register_forward_hook(lambda *_: clearing.forwarded()).remove)
        names, target = at.target.layout.parameters, at.target
        for optimizer in target.optimizers[1:]:  # judged before its own step, remembered after it
            def own_step(*_: Any, optimizer: torch.optim.Optimizer = optimizer) -> None:
                self.later += clearing.findings(names, clearing.attached, lambda: target.held([optimizer]))

            def own_used(*_: Any, optimizer: torch.optim.Optimizer = optimizer) -> None:
                clearing.stepped(clearing.attached, only=target.held([optimizer]))
            stack.callback(optimizer.register_step_pre_hook(own_step).remove)
            stack.callback(optimizer.register_step_post_hook(own_used).remove)

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        later, self.later = self.later, []
        first = list(at.target.optimizers[:1])
        out = found + later + self.clearing.findings(at.target.layout.parameters, at.params,
                                                     lambda: at.target.held(first))
        if at.check and at.target.optimizer is not None:
            self.clearing.attach(at.params)
        return out


class Membership:
    """``not-in-optimizer`` at each check step for a trainable parameter no param group holds that
    holds a gradient (it takes part in the loss, and nothing applies it); after step 0, two or more
    newly unheld at once are one ``parameters-replaced`` (``load_state_dict(assign=True)``, ``.to()``,
    a module swapped in). A parameter left out from the start is named once, never called replaced.
    One that no optimizer holds and that gets no gradient (a part run under ``torch.no_grad()``, as a
    frozen feature extractor is) is frozen in effect: named only once it holds a gradient. A step at
    which the optimizers hold every parameter (the step's ``held_mask`` all true) has none to name and
    none newly unheld: nothing more is looked up."""

    @classmethod
    def build(cls, kit: Kit) -> Membership | None:
        return cls() if kit.target.optimizer is not None else None

    def __init__(self) -> None:
        self.unheld: set[str] = set()  # the parameters no param group held at the last check step
        self.waiting: set[str] = set()  # of those, the ones not named yet: no gradient so far

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if not at.check or at.held is None:
            return found
        mask = at.held_mask
        if mask is not None and len(mask) == len(at.params) and np.count_nonzero(mask) == len(mask):
            self.unheld, self.waiting = set(), set()
            return found
        unheld = not_in_optimizer(at.target.layout.parameters, at.params, at.held)
        if not unheld:
            self.unheld, self.waiting = set(), set()
            return found
        graded = _with_gradients(at)
        new = [f for f in unheld if f.where not in self.unheld]
        late = [f for f in unheld if f.where in self.waiting and f.where in graded]  # a gradient at last
        self.waiting = {f.where for f in unheld if f.where not in graded and (
            f.where in self.waiting or f.where not in self.unheld)}
        self.unheld = {f.where for f in unheld}
        return found + replaced_findings([f for f in new if f.where in graded], at.step) + late


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
    """``optimizer-not-stepped``: one of several optimizers has not stepped once while its parameters got
    new gradients at two of the first one's steps (not only added onto: a critic's backward reaching a
    generator that clears them before its own), or, having stepped, misses as many steps as
    :meth:`OptimizerSteps.findings` allows."""

    @classmethod
    def build(cls, kit: Kit) -> OptimizerStepped | None:
        return cls(kit.optimizer_steps) if kit.optimizer_steps is not None else None

    def __init__(self, steps: OptimizerSteps) -> None:
        self.steps = steps

    def attach(self, at: At, stack: ExitStack) -> None:
        self.steps.attach([at.target.names_of(o) for o in at.target.optimizers])
        stack.callback(self.steps.remove)

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if len(self.steps.optimizers) < 2:  # one optimizer: no other one to miss its steps
            return found
        return found + self.steps.findings(at.step)


class TiesKept:
    """``tie-broken`` / ``tie-weakened`` at a check step when the objects behind the parameter names
    are not those at the last check and a tie the model had when the watch opened is gone."""

    def attach(self, at: At, stack: ExitStack) -> None:
        root = at.target.root
        self.ties = snapshot_ties(root)
        self.names = tuple(n for n, _ in root.named_parameters(remove_duplicate=False))
        self.watched = self.names == at.target.layout.parameters  # no alias: the step's own list is read
        self.ids = self._ids(at)

    def _ids(self, at: At) -> tuple[int, ...]:
        """The object behind every parameter name, aliases included: the step's list of the watched
        parameters when no name is an alias, else read from the owners' registries."""
        return tuple(map(id, at.params if self.watched else current(at.target.root, self.names)))

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if not at.check:
            return found
        ids = self._ids(at)
        if ids == self.ids:
            return found
        self.ids = ids
        return found + compare_ties(self.ties, at.target.root)


# -- once the step's gradients are measured, before the optimizer step (collectives allowed) ----
class ReplicasAgree:
    """The distributed step check (:func:`inspector.distributed.check_step`) at each check step with
    the distributed checks on: ``replica-drift``, ``gradient-not-synchronized``, ``gradient-far-off``,
    ``shard-imbalance``, ``nonfinite-*`` from every rank's gathered columns (the same on every rank;
    placed on the row of the rank each is about once the numbers are gathered). On several ranks this
    rank's numbers are taken here, before the step, and travel with the step's own numbers in one
    ``all_gather`` after it (:func:`check_findings` reads them)."""

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        if not (at.check and at.ranks.distributed):
            return found
        from ...distributed.check import checked_step, local_step  # here: the package re-exports read_run

        layout = at.target.layout
        norms = torch.zeros(len(layout.parameters), dtype=torch.float64)
        for idx, part in at.st.grad_parts:
            norms[torch.from_numpy(idx)] = part.to("cpu", torch.float64)
        options = {"group": at.ranks.group, "loss": at.loss, "timeout": at.ranks.timeout,
                   "grad_norms": (layout.parameters, norms)}
        if at.ranks.world == 1:
            return found + checked_step(at.target.model, at.step, None, **options).findings
        # the ranks checked in before this step (``Ranks.check_in``): no second agreement through the store
        at.st.check_local = local_step(at.target.model, at.step, agreed=at.ranks.meeting is not None,
                                       grads=at.st.grads, **options)
        return found


def check_findings(local: Any, rows: Any) -> list[Finding]:
    """The findings of :class:`ReplicasAgree`'s check from every rank's numbers (``rows``, as gathered)."""
    from ...distributed.columns import column_findings

    return column_findings(local.gathered(rows))
