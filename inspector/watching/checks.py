"""The checks of a watch that follow the loop rather than the numbers: gradients cleared between
steps, modules left in eval mode, frozen parameters, parameters replaced mid-run, an optimizer that
never steps, and a run in which nothing updates."""

from __future__ import annotations

import operator
import weakref
from collections.abc import Sequence
from itertools import compress, repeat
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle
from torch.utils.weak import WeakIdKeyDictionary

from ..utils.codes import coded
from ..utils.findings import Finding, InspectorError
from ..utils.labels import ROOT_LABEL, listed, module_label
from .flags import _piece
from .layout import gradients

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


def _held_values(flags: list[torch.Tensor]) -> list[bool]:
    """The ``any()`` flags read to the host at once; True where they cannot be read (a meta tensor)."""
    try:
        device = flags[0].device
        return [bool(v) for v in torch.stack([f.to(device) for f in flags]).tolist()]
    except (RuntimeError, NotImplementedError):
        return [True] * len(flags)


class GradientClearing:
    """Whether the gradients a step used were cleared (set to None or zeroed) before a backward added to
    them and the next step used the sum.

    A hook on each parameter runs before autograd accumulates into ``.grad``. After a step, the first
    one asks whether ``.grad`` is still the very tensor the step used (a weak reference, so a freed
    gradient whose address is reused never matches) with the same version counter (``zero_()`` and
    every write move it): then this backward adds onto the used gradient, unless it holds only zeros
    (cleared through ``.data``, which moves no version counter: ``p.grad.data.zero_()``). Such a
    gradient is washed when a later backward finds it zeroed or replaced since (several optimizers, each
    zeroing only its own parameters before its own backward), and reported when the next step still
    holds it. Zeroing before the forward, between forward and backward (Lightning) or after the step
    are all clearing; several backward passes before one step (accumulation) are one step.

    The hooks stand down (return at once) from the end of a forward pass of the model at which no hooked
    parameter holds a gradient the last step used (every one set to None or replaced: ``zero_grad()``'s
    default, or each one zeroed in place: ``zero_grad(set_to_none=False)``) until the next step: from then
    on no backward can add onto one, so what they would look at cannot be found.
    """

    def __init__(self) -> None:
        self.after: dict[int, weakref.ref] = {}  # index -> the step's gradient,
        self.versions: dict[int, int] = {}  # and its version (two dicts: no tuple kept per parameter)
        # added onto: (gradient, version expected next, whether it held a non-zero value before: a tensor)
        self.dirty: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}
        self.hooked: WeakIdKeyDictionary = WeakIdKeyDictionary()  # parameter -> (index, handle)
        self.attached: list[torch.Tensor | None] = []  # the list last hooked, and which of it trains
        self.wanted: list[bool] = []
        self.used: set[int] = set()  # the ids of the gradients the last step used
        self.looking = True  # whether the hooks look (False once no used gradient can be added onto)
        self.only_attached = True  # every hooked parameter is in ``attached`` (else the hooks always look)

    def attach(self, params: list[torch.Tensor | None]) -> None:
        """Hook every parameter of ``params`` not hooked yet (new ones after a replacement included)."""
        try:  # one pass in C when no parameter is None
            wanted = list(map(_REQUIRES_GRAD, params))
        except AttributeError:
            wanted = [p is not None and p.requires_grad for p in params]
        if wanted == self.wanted and len(params) == len(self.attached) and all(
                map(operator.is_, params, self.attached)):
            return  # the same parameters, as trainable as at the last call: hooked then
        self.attached, self.wanted = list(params), wanted
        for i, p in enumerate(params):
            if p is None or not p.requires_grad:
                continue
            known = self.hooked.get(p)
            if known is not None and known[0] == i:
                continue
            if known is not None:
                known[1].remove()
            self.hooked[p] = (i, p.register_hook(self._hook(i, weakref.ref(p))))
        # a parameter hooked by an earlier call and dropped from this list may still be hooked (and alive)
        hooked_here = {id(p) for p, w in zip(params, wanted, strict=True) if w}
        self.only_attached = len(self.hooked) <= len(hooked_here)

    def _hook(self, i: int, param: weakref.ref) -> Any:
        def hook(grad: torch.Tensor) -> None:
            if not self.looking:
                return
            key = self.dirty.pop(i, None)
            ref, version = (self.after.pop(i, None), self.versions.get(i, -1)) if key is None else key[:2]
            p = param()
            if ref is None or p is None:
                return
            g: torch.Tensor | None = p.grad
            if g is None or g._version != version or ref() is not g:
                return
            # an in-place add moves the version by one; whether the old values were cleared without moving
            # it (``p.grad.data.zero_()``) is read once the step needs it: of this rank's piece, taken now,
            # before the add (no host sync, no collective in a hook)
            self.dirty[i] = (ref, version + 1, _piece(cast(torch.Tensor, g)).any() if key is None else key[2])
        return hook

    def stepped(self, params: list[torch.Tensor | None], zero: np.ndarray | None = None) -> None:
        """After a step: remember each gradient the step used (not those all zero then, marked in
        ``zero``: a backward adding onto a zeroed gradient adds nothing old)."""
        grads = gradients(params)
        idx: Sequence[int]
        if all(map(operator.is_not, grads, repeat(None))) and (zero is None or not np.count_nonzero(zero)):
            idx, used = range(len(grads)), grads  # every gradient there and none all zero (most steps)
        else:
            keep = np.fromiter(map(operator.is_not, grads, repeat(None)), dtype=bool, count=len(grads))
            if zero is not None:
                keep &= ~np.asarray(zero, dtype=bool)
            idx = np.flatnonzero(keep).tolist()
            used = [grads[i] for i in idx]
        self.after = dict(zip(idx, map(weakref.ref, used), strict=True))
        self.versions = dict(zip(idx, map(_VERSION, used), strict=True))
        self.dirty = {}
        self.used = set(map(id, used))
        self.looking = bool(used)

    def forwarded(self) -> None:
        """At the end of a forward pass of the model: when no hooked parameter holds a gradient the last
        step used, untouched since (an id that matches a new gradient at a reused address keeps the hooks
        looking; a gradient written since, as ``zero_()`` does, can no longer be found added onto), the
        hooks stand down until the next step."""
        if not (self.looking and self.only_attached and not self.dirty):
            return
        grads = gradients(self.attached)
        if not self.used.isdisjoint(map(id, grads)):
            versions, count = self.versions, len(grads)
            for i, ref in self.after.items():
                g = grads[i] if i < count else None
                if g is not None and g._version == versions[i] and ref() is g:
                    return  # a used gradient as the step left it: a backward may add onto it
        self.looking = False

    def findings(self, names: tuple[str, ...], params: list[torch.Tensor | None], held: Any) -> list[Finding]:
        """``gradient-not-cleared`` for the optimizer's parameters (``held()``: their ids) whose step now
        uses a gradient added onto the last step's; one the optimizer does not hold is named by
        ``not-in-optimizer`` instead."""
        if not self.dirty:  # no backward added onto a used gradient (most steps)
            return []
        kept = sorted(i for i, (ref, _, _) in self.dirty.items()
                      if i < len(params) and (p := params[i]) is not None and p.grad is not None
                      and ref() is p.grad)
        if kept:  # only a gradient that held a non-zero value was added onto (one host read for all)
            kept = list(compress(kept, _held_values([self.dirty[i][2] for i in kept])))
        self.dirty = {}
        if not kept:
            return []
        ids = held()
        found = [names[i] for i in kept if id(params[i]) in ids]
        if not found:
            return []
        return [coded("gradient-not-cleared", found[0],
                        f"the gradients of {len(found)} parameter(s) ({listed(found)}) were not cleared "
                        "after the last step: this step's gradient was added to the old one. Call "
                        "optimizer.zero_grad() (or model.zero_grad()) once per step")]

    def remove(self) -> None:
        for _, handle in list(self.hooked.values()):
            handle.remove()
        self.hooked = WeakIdKeyDictionary()
        self.attached, self.wanted = [], []
        self.looking, self.only_attached = True, True


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
        self.fed = [0] * len(self.optimizers)  # before it stepped: first-optimizer steps with its gradients
        self.handles: list[RemovableHandle] = []

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
        held gradients at ``after`` of its steps (a generator stepped every fifth step, whose gradients
        the critic's steps do not reach, or a part trained from a later stage, is waiting, not stalled);
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
            never = self.last_step[i] < 0
            fed = never and self._has_gradients(i)
            self.fed[i] += fed
            quiet = self.fed[i] if never else step - self.last_step[i]
            limit = after if never or (self.gap[i] == 0 and self.streak[i] >= settled) else max(
                settled, 2 * self.gap[i] + 2)
            if quiet == limit and (fed or not never):
                names = self.names[i]
                modules = list(dict.fromkeys(n.rpartition(".")[0] for n in names))
                what = "has not stepped once" if never else f"has not stepped for {quiet} steps"
                out.append(coded("optimizer-not-stepped", names[0] if names else ROOT_LABEL,
                                   f"optimizer {i} ({type(self.optimizers[i]).__name__}, holding "
                                   f"{len(names)} parameters of {listed(modules)}) {what} while optimizer 0 "
                                   "stepped: its parameters do not train. Call its step() in the loop"))
        return out

    def _has_gradients(self, i: int) -> bool:
        """Whether a parameter of optimizer ``i`` holds a gradient now."""
        return any(p.grad is not None for g in self.optimizers[i].param_groups for p in g["params"])

    def waiting(self) -> set[str]:
        """The names of the parameters only optimizers that have not stepped once hold (after the first):
        their gradients come with their own optimizer's steps, not with the first one's."""
        stepped = [i == 0 or self.last_step[i] >= 0 or self.counts[i] > 0 for i in range(len(self.names))]
        held = {n for names, s in zip(self.names, stepped, strict=True) if s for n in names}
        return {n for names, s in zip(self.names, stepped, strict=True) if not s for n in names} - held

    def active(self, step: int) -> list[torch.optim.Optimizer]:
        """The first optimizer and those that stepped since its last step (before :meth:`findings`)."""
        return [o for i, o in enumerate(self.optimizers)
                if i == 0 or self.counts[i] or self.last_step[i] == step - 1]

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

