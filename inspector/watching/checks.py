"""The checks of a watch that follow the loop rather than the numbers: modules left in eval mode,
frozen parameters, parameters replaced mid-run, an optimizer that never steps, and a run in which
nothing updates (the gradients cleared between steps are :mod:`.clearing`'s)."""

from __future__ import annotations

import operator
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..utils.codes import coded
from ..utils.findings import Finding, InspectorError
from ..utils.labels import ROOT_LABEL, listed, module_label

MODE_DEPENDENT = (nn.modules.batchnorm._BatchNorm, nn.modules.instancenorm._InstanceNorm,
                  nn.modules.dropout._DropoutNd, nn.AlphaDropout, nn.FeatureAlphaDropout)


Optimizers = torch.optim.Optimizer | Sequence[torch.optim.Optimizer] | None


def optimizer_list(optimizer: Optimizers) -> list[torch.optim.Optimizer]:
    """The optimizers given to a watch, as a list (the first one's steps are the steps)."""
    if optimizer is None:
        return []
    found = list(optimizer) if isinstance(optimizer, (list, tuple)) else [optimizer]
    for o in found:
        if not isinstance(o, torch.optim.Optimizer):
            raise InspectorError(f"watch's optimizer must be a torch.optim.Optimizer (or a list of them), "
                                 f"got {type(o).__name__}")
    if not found:
        raise InspectorError("watch was given an empty list of optimizers: give one, a list, or None")
    return [o for o in found if isinstance(o, torch.optim.Optimizer)]


_VERSION = operator.attrgetter("_version")
_REQUIRES_GRAD = operator.attrgetter("requires_grad")


class TrainingMode:
    """BatchNorm / InstanceNorm / Dropout modules in eval mode when the optimizer steps (read at each
    step, so it holds however the forward was called: Lightning calls ``training_step``, not the
    root's forward). A module inside a part whose parameters are all frozen is left alone: a frozen
    backbone in eval mode is on purpose; so is a norm layer whose own affine parameters are frozen, or
    one that keeps no running statistics."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        self.modules = [(n, m) for n, m in root.named_modules() if isinstance(m, MODE_DEPENDENT)
                        and not (isinstance(m, nn.modules.dropout._DropoutNd | nn.AlphaDropout) and m.p == 0)
                        and not (isinstance(m, nn.modules.instancenorm._InstanceNorm)
                                 and not m.track_running_stats)]

    def findings(self) -> list[Finding]:
        if all(m.training for _, m in self.modules):
            return []
        seen = [n for n, m in self.modules
                if not m.training and not self._frozen_part(n) and not _on_purpose(m)]
        if not seen:
            return []
        kinds = sorted({type(m).__name__ for n, m in self.modules if n in set(seen)})
        if not self.root.training:
            return [coded("eval-mode-module", ROOT_LABEL,
                            f"the model is in eval mode while it trains: its {len(seen)} "
                            f"{'/'.join(kinds)} module(s) ({listed(seen)}) use running statistics or drop "
                            "nothing. Call model.train() before the training loop (and after each "
                            "validation pass)")]
        return [coded("eval-mode-module", seen[0],
                        f"{listed(seen)} ({'/'.join(kinds)}) ran in eval mode while the model trains: "
                        "a BatchNorm then neither uses the batch's statistics nor updates its running "
                        "ones, a Dropout drops nothing. Set .train() on it, or freeze its part on purpose")]

    def _frozen_part(self, name: str) -> bool:
        """The module's parent holds parameters and none of them requires grad."""
        parent = self.root.get_submodule(name.rpartition(".")[0]) if "." in name else self.root
        flags = [p.requires_grad for p in parent.parameters()]
        return bool(flags) and not any(flags)


def _on_purpose(m: nn.Module) -> bool:
    """A norm layer kept in eval mode by design: its own affine parameters are all frozen (the
    fine-tuning recipe, ``norm_eval=True``), or it keeps no running statistics (eval mode then changes
    nothing)."""
    if not isinstance(m, nn.modules.batchnorm._BatchNorm | nn.modules.instancenorm._InstanceNorm):
        return False
    own = [p.requires_grad for p in m.parameters(recurse=False)]
    return (bool(own) and not any(own)) or not m.track_running_stats


def frozen_findings(root: nn.Module) -> list[Finding]:
    """One ``frozen-parameters`` (information) naming the modules whose parameters do not require grad."""
    frozen: dict[str, int] = {}
    total = 0
    for name, p in root.named_parameters():
        total += 1
        if not p.requires_grad:
            module = name.rpartition(".")[0]
            frozen[module] = frozen.get(module, 0) + p.numel()
    if not frozen:
        return []
    names = list(frozen)
    return [coded("frozen-parameters", module_label(names[0]),
                    f"{sum(frozen.values()):,} parameter elements in {len(names)} module(s) "
                    f"({listed(names)}) do not require grad: they are frozen and not watched")]


def replaced_findings(found: list[Finding], step: int) -> list[Finding]:
    """After the first step, ``not-in-optimizer`` for two or more parameters at once is one
    ``parameters-replaced`` (a ``load_state_dict(assign=True)``, ``.to()`` or a module swapped in)."""
    missing = [f for f in found if f.code == "not-in-optimizer"]
    if step == 0 or len(missing) < 2:
        return found
    names = [f.where for f in missing]
    modules = list(dict.fromkeys(n.rpartition(".")[0] for n in names))
    grouped = coded("parameters-replaced", names[0],
                      f"{len(names)} parameters of {len(modules)} module(s) ({listed(modules)}) are now "
                      "tensors that no param group of the optimizer holds: they were replaced "
                      "(load_state_dict(assign=True), .to(), a module swapped in) and never change from "
                      "here. Rebuild the optimizer from model.parameters() after the change")
    return [f for f in found if f.code != "not-in-optimizer"] + [grouped]


class Progress:
    """Whether training moves anything: ``no-update`` when for ``window`` check steps in a row every
    learning rate is 0, or every parameter that had a gradient kept its norm exactly;
    ``optimizer-not-stepped`` when one of several optimizers has not stepped while the first did."""

    def __init__(self, window: int = 2, start: np.ndarray | None = None) -> None:
        self.window = window
        self.last = start  # the parameters' norms before the first step, where known
        self.still = 0
        self.zero_lr = 0

    def step(self, lrs: list[float], param_norm: np.ndarray | None, param_grad: np.ndarray,
             has_grad: np.ndarray, skipped: bool, held: np.ndarray | None = None,
             moving: np.ndarray | None = None) -> list[Finding]:
        """One step's check; ``held`` marks the parameters an optimizer holds (the others are named by
        ``not-in-optimizer`` / ``parameters-replaced`` and left out here); ``moving``, where the caller
        has it: the parameters with a finite non-zero gradient and a finite norm (worked out if not)."""
        out = []
        self.zero_lr = self.zero_lr + 1 if lrs and not any(lrs) else 0  # every lr 0 (NaN is not)
        if self.zero_lr == self.window:
            out.append(coded("no-update", ROOT_LABEL,
                               f"every learning rate has been 0 for {self.window} steps: nothing trains. "
                               "Check the scheduler (a warm-up that never leaves 0, a lambda that returns "
                               "0) and the lr given to the optimizer"))
        if param_norm is None or skipped:
            return out
        if moving is None:
            moving = has_grad & np.isfinite(param_grad) & (param_grad > 0) & np.isfinite(param_norm)
        if held is not None:
            moving = moving & held
        if self.last is not None and np.count_nonzero(moving) and self.zero_lr < self.window:
            same = moving & (param_norm == self.last)
            self.still = self.still + 1 if np.count_nonzero(same) == np.count_nonzero(moving) else 0
            if self.still == self.window:
                out.append(coded("no-update", ROOT_LABEL,
                                   f"none of the {int(moving.sum())} parameters with a gradient changed in "
                                   f"{self.window} steps: optimizer.step() moves nothing (an lr of 0, an "
                                   "update below the weights' precision: bfloat16 weights with a small lr, "
                                   "or the weights restored after each step)"))
        self.last = param_norm.copy()
        return out


class OptimizerSteps:
    """Counts the steps of every optimizer given to the watch after the first, which marks the step."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        self.optimizers = list(optimizers)
        self.names: list[list[str]] = [[] for _ in self.optimizers]  # each optimizer's parameter names
        self.counts = [0] * len(self.optimizers)
        self.last_step = [-1] * len(self.optimizers)
        self.gap = [0] * len(self.optimizers)  # the longest run of first-optimizer steps without one
        self.streak = [0] * len(self.optimizers)  # first-optimizer steps in a row with one
        self.fed = [0] * len(self.optimizers)  # before it stepped: first-optimizer steps with new gradients
        self.held_steps = [0] * len(self.optimizers)  # and with any gradient
        self.named_never = [False] * len(self.optimizers)
        # before it stepped: each of its parameters' gradient at the last look (weakly) and its version
        self.seen: list[dict[int, tuple[weakref.ref, int]]] = [{} for _ in self.optimizers]
        self.handles: list[RemovableHandle] = []
        self._waiting: tuple[set[str], np.ndarray | None] = (set(), None)  # waiting() and its mask, last made

    def attach(self, names: list[list[str]]) -> None:
        """Count the steps of every optimizer after the first (``names``: each one's parameter names)."""
        self.names = names
        for i, opt in enumerate(self.optimizers[1:], start=1):
            self.handles.append(opt.register_step_post_hook(self._counter(i)))

    def first_is(self, optimizer: torch.optim.Optimizer, names: list[str]) -> None:
        """The first optimizer (whose steps are the steps) is now ``optimizer``, holding ``names``."""
        self.optimizers[0], self.names[0] = optimizer, names

    def _counter(self, i: int) -> Any:
        def hook(*_: Any) -> None:
            self.counts[i] += 1
        return hook

    def findings(self, step: int, after: int = 2, settled: int = 10) -> list[Finding]:
        """At the first optimizer's step ``step``: those that have not stepped once while their parameters
        got new gradients at ``after`` of its steps, or held gradients at ``settled`` of them (a generator
        stepped every fifth step, whose gradients the critic's steps do not reach or only add onto, or a
        part trained from a later stage, is waiting, not stalled: see :meth:`_new_gradients`; gradients
        that only pile up for ``settled`` steps are an optimizer forgotten, its ``zero_grad()`` too);
        those that stepped with each of its last ``settled`` steps and then missed ``after``; the others
        once they miss twice their longest gap so far (at least ``settled`` steps)."""
        out = []
        for i in range(1, len(self.optimizers)):
            if self.counts[i]:
                if self.last_step[i] >= 0:
                    self.gap[i] = max(self.gap[i], step - self.last_step[i] - 1)
                self.streak[i] = self.streak[i] + 1 if step - self.last_step[i] == 1 else 1
                self.last_step[i], self.counts[i] = step, 0
                continue
            if self.last_step[i] < 0:
                held, fed = self._new_gradients(i)
                self.fed[i] += fed
                self.held_steps[i] += held
                due = (fed and self.fed[i] == after) or (held and self.held_steps[i] == settled)
                if not due or self.named_never[i]:
                    continue
                self.named_never[i] = True
                what = "has not stepped once"
            else:
                quiet = step - self.last_step[i]
                limit = after if self.gap[i] == 0 and self.streak[i] >= settled else max(
                    settled, 2 * self.gap[i] + 2)
                if quiet != limit:
                    continue
                what = f"has not stepped for {quiet} steps"
            names = self.names[i]
            modules = list(dict.fromkeys(n.rpartition(".")[0] for n in names))
            out.append(coded("optimizer-not-stepped", names[0] if names else ROOT_LABEL,
                             f"optimizer {i} ({type(self.optimizers[i]).__name__}, holding "
                             f"{len(names)} parameters of {listed(modules)}) {what} while optimizer 0 "
                             "stepped: its parameters do not train. Call its step() in the loop"))
        return out

    def _new_gradients(self, i: int) -> tuple[bool, bool]:
        """Whether a parameter of optimizer ``i`` holds a gradient, and whether one is new since the last
        look: one it did not hold then, another tensor (``zero_grad()`` set it to None and a backward made
        it again), or the same one written at least twice (zeroed in place, then a backward's add). A
        backward that only adds onto it (a critic's, reaching a generator through samples not detached)
        is not new: those gradients may wait for a step that clears them first."""
        seen, now = self.seen[i], {}
        new = False
        for p in (p for g in self.optimizers[i].param_groups for p in g["params"]):
            grad = p.grad
            if grad is None:
                continue
            before = seen.get(id(p))
            version = grad._version
            new = new or before is None or before[0]() is not grad or version - before[1] >= 2
            now[id(p)] = (weakref.ref(grad), version)
        self.seen[i] = now
        return bool(now), new

    def waiting_mask(self, names: tuple[str, ...]) -> np.ndarray | None:
        """:meth:`waiting` as a mask over ``names`` (None while no parameter waits), made again only when
        the set changes."""
        waiting = self.waiting() if len(self.optimizers) > 1 else set()
        if waiting != self._waiting[0]:
            mask = np.isin(np.asarray(names, dtype=object), list(waiting)) if waiting else None
            self._waiting = (waiting, mask)
        return self._waiting[1]

    def waiting(self) -> set[str]:
        """The names of the parameters only optimizers that have not stepped once hold (after the first):
        their gradients come with their own optimizer's steps, not with the first one's."""
        stepped = [i == 0 or self.last_step[i] >= 0 or self.counts[i] > 0 for i in range(len(self.names))]
        held = {n for names, s in zip(self.names, stepped, strict=True) if s for n in names}
        return {n for names, s in zip(self.names, stepped, strict=True) if not s for n in names} - held

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()


def failure_finding(exc: BaseException, step: int) -> Finding:
    """``run-failed``: the exception that ended the watched block, at the step it was in."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return coded("run-failed", ROOT_LABEL,
                   f"the run ended at step {step} by {type(exc).__name__}"
                   f"{': ' + text[:300] if text else ''}; every step before it is in the file")


EXPLAINED = ("nonfinite-forward", "nonfinite-backward", "nonfinite-loss", "nonfinite-parameter")


def nonfinite_gradients(counts: np.ndarray, modules: tuple[str, ...], found: list[Finding]) -> list[Finding]:
    """``nonfinite-gradient`` when some modules' gradients hold NaN/Inf (``counts``: elements per module)
    and nothing found this step explains it (a producer, a non-finite loss). Where every module's
    gradient is non-finite, the loss or a forward NaN made them so (``where``: the model); otherwise
    the last such module in the model's order is where the backward turned them non-finite."""
    bad = np.flatnonzero(counts > 0)  # a NaN count is not over 0
    if not len(bad) or any(f.code in EXPLAINED for f in found):
        return []
    total = int(np.nan_to_num(counts).sum())
    if len(bad) == len(modules):
        return [coded("nonfinite-gradient", ROOT_LABEL,
                        f"every module's gradient holds NaN/Inf ({total:,} elements): the loss or a forward "
                        "pass turned non-finite. Log the loss (w.log(loss=...)) or watch with "
                        "nonfinite=True to name the module that produced it")]
    last = module_label(modules[int(bad[-1])])
    names = listed([modules[i] for i in bad])
    return [coded("nonfinite-gradient", last,
                    f"the gradients of {len(bad)} module(s) up to {last} ({names}) hold NaN/Inf ({total:,} "
                    f"elements) while the modules after it are finite: the backward of {last}, or of the "
                    "module just after it, made them. Watch with nonfinite=True to name it")]

