"""Whether the gradients a step used were cleared before a backward added onto them
(``gradient-not-cleared``): hooks on the parameters, read by the rows before and after the step."""

from __future__ import annotations

import operator
import weakref
from collections.abc import Sequence
from itertools import compress, repeat
from typing import Any, cast

import numpy as np
import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..utils.codes import coded
from ..utils.findings import Finding
from ..utils.labels import listed
from .flags import _piece
from .layout import gradients

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
        self.index: dict[int, int] = {}  # a parameter's id -> its place in that list
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
        self.index = {id(p): i for i, p in enumerate(params) if p is not None}
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

    def stepped(self, params: list[torch.Tensor | None], zero: np.ndarray | None = None,
                grads: list[torch.Tensor | None] | None = None, only: set[int] | None = None) -> None:
        """After a step: remember each gradient the step used (not those all zero then, marked in
        ``zero``: a backward adding onto a zeroed gradient adds nothing old); ``grads``: those of
        ``params`` as read before the step (the optimizer's step does not replace them), else read now.
        ``only``: the ids of the parameters the optimizer that stepped holds (None: every parameter);
        the others keep what their own optimizer's last step used."""
        if only is not None:
            self._stepped_part(params, grads, zero, only)
            return
        if grads is None or len(grads) != len(params):
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

    def _stepped_part(self, params: list[torch.Tensor | None], grads: list[torch.Tensor | None] | None,
                      zero: np.ndarray | None, only: set[int]) -> None:
        """:meth:`stepped` for the parameters ``only`` names (one optimizer of several stepped): each found
        by its id among those hooked, not by a pass over every parameter."""
        given = grads is not None and len(grads) == len(params)
        for pid in only:
            i = self.index.get(pid)
            if i is None or i >= len(params) or (p := params[i]) is None or id(p) != pid:
                continue  # not hooked (yet): nothing could be found added onto
            self.dirty.pop(i, None)
            self.versions.pop(i, None)
            old = self.after.pop(i, None)
            if old is not None and (was := old()) is not None:
                self.used.discard(id(was))
            g = grads[i] if given else p.grad  # type: ignore[index]
            if g is not None and not (zero is not None and i < len(zero) and zero[i]):
                self.after[i], self.versions[i] = weakref.ref(g), g._version
                self.used.add(id(g))
        self.looking = bool(self.used)

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
        """``gradient-not-cleared`` for the parameters of the optimizer about to step (``held()``: their ids)
        whose step now uses a gradient added onto the last step's. Only theirs are judged (and forgotten):
        another optimizer's are judged at its own step; one no optimizer holds is named by
        ``not-in-optimizer`` instead."""
        if not self.dirty:  # no backward added onto a used gradient (most steps)
            return []
        ids = held()
        judged = [i for i in self.dirty if i < len(params) and (p := params[i]) is not None and id(p) in ids]
        kept = sorted(i for i in judged if (g := cast(torch.Tensor, params[i]).grad) is not None
                      and self.dirty[i][0]() is g)
        flags = [self.dirty[i][2] for i in kept]
        for i in judged:
            del self.dirty[i]
        if kept:  # only a gradient that held a non-zero value was added onto (one host read for all)
            kept = list(compress(kept, _held_values(flags)))
        found = [names[i] for i in kept]
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
        self.attached, self.wanted, self.index = [], [], {}
        self.looking, self.only_attached = True, True


__all__ = ["GradientClearing"]
