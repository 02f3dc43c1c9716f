"""The checks after the optimizer's step that ask whether training moves anything: every lr 0 or no
norm changing (``Updates``), a param group at lr 0 (``IdleGroups``), a module whose weights never change
(``StillModules``) (:mod:`inspector.watching.rules`)."""

from __future__ import annotations

from contextlib import ExitStack
from itertools import repeat
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ...utils.codes import coded
from ...utils.findings import Finding
from ...utils.labels import listed, module_label
from ..checks import Progress
from ..flags import _piece
from ..layout import fused_norms, to_host

if TYPE_CHECKING:
    from ..checks import OptimizerSteps
    from ..events import At, Kit


class Updates:
    """``no-update``: every learning rate 0 for two steps, or no parameter an optimizer holds with a
    finite non-zero gradient changed its norm for two check steps (not counting those only an optimizer
    that has not stepped once holds: a generator waiting for its first step, or one forgotten, which
    ``optimizer-not-stepped`` names)."""

    @classmethod
    def build(cls, kit: Kit) -> Updates | None:
        return cls(kit.optimizer_steps)

    def __init__(self, steps: OptimizerSteps | None = None) -> None:
        self.steps = steps

    def attach(self, at: At, stack: ExitStack) -> None:
        start = None  # a sharded model's norms are global only once stepped
        if not at.target.sharded:
            start = np.full(len(at.params), np.nan)
            for idx, part in fused_norms(at.params):
                start[idx] = to_host([part])[0]
        self.progress = Progress(start=start)

    def __call__(self, at: At, found: list[Finding]) -> list[Finding]:
        n = at.n
        held = at.held_mask
        waiting = self.steps.waiting_mask(at.target.layout.parameters) if self.steps is not None else None
        if waiting is not None and held is not None and len(held) == len(waiting):
            held = held & ~waiting
        return found + self.progress.step(at.lrs, n.param_norm if n.checked else None, n.param_grad,
                                          n.has_grad, bool(n.skipped), held,
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
                lr = lr if lr is not None else self._lrs(at)  # looked up once a step, at its first finding
                out.append(self._finding(at, module, idx, lr))
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
