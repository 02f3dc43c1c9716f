"""Findings from one step's numbers on the host: dead, exploding and non-finite values."""

from __future__ import annotations

import math
import re
from collections import deque
from collections.abc import Sequence

import numpy as np

from ..utils.codes import coded
from ..utils.findings import Finding
from ..utils.labels import LOSS_LABEL, ROOT_LABEL, listed, module_label
from .layout import Layout
from .numbers import all_finite, nans

# Measured on 160 healthy runs of 200 steps (an MLP and a CNN with BatchNorm; SGD 0.1 and 0.3, Adam 1e-3
# and 1e-2; ten seeds; batches of 16 and 32): see docs/training.md, "How spikes are judged".
NOISE = 7.0  # a spike is over its median by more than this many median absolute deviations (log scale)
WARM_UP = 10  # values seen before anything is judged
SETTLE = 5  # steps after a spike of the whole model not judged: a large step's gradients settle back


def _log(values: np.ndarray | float) -> np.ndarray:
    """Natural log of the finite positive ``values``, NaN elsewhere."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim == 1 and len(v) and all_finite(v) and np.minimum.reduce(v) > 0:  # every value finite, over 0
        return np.log(v)
    out = nans(len(v)) if v.ndim == 1 else np.full(v.shape, np.nan)
    return np.log(v, out=out, where=np.isfinite(v) & (v > 0))


def _median(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The median of each column of ``a`` over its non-NaN values (NaN where none), and their count:
    ``np.nanmedian`` without its slow path for small arrays (it costs milliseconds a call)."""
    count = np.isfinite(a).sum(axis=0)
    ordered = np.sort(a, axis=0)  # NaN last
    low = np.take_along_axis(ordered, np.maximum((count - 1) // 2, 0)[None], axis=0)[0]
    high = np.take_along_axis(ordered, np.minimum(count // 2, len(a) - 1)[None], axis=0)[0]
    return np.where(count > 0, (low + high) / 2, np.nan), count


def _excess(past: np.ndarray, now: np.ndarray, factor: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Over the columns of ``past`` (log values, NaN for none): how far ``now`` is above their median,
    the threshold it must pass (``log(factor)`` or ``NOISE`` deviations, the larger), and the median.
    A column with fewer than ``WARM_UP`` values has a NaN excess: it is not judged."""
    median, count = _median(past)
    mad, _ = _median(np.abs(past - median))
    excess = np.where(count >= WARM_UP, now - median, np.nan)
    return excess, np.maximum(math.log(factor), NOISE * mad), median


SHARE = 0.01  # the least part of a step's gradient norm a module must hold to be exploding alone
SUDDEN = 3  # steps a module's gradient must jump over at once to be out of line on its own
SETTLED, CUT_AFTER = 20, 2  # a gradient seen this many steps in a row, then missing this many: cut off
NAMED_CAUSE = ("nonfinite-forward", "nonfinite-parameter")  # at the loss's check: a producer already named
GROUP_OVER = 4  # more parameters than this going dead at one step are one dead-gradient finding

class Detectors:
    """State kept across steps for the findings that need a history.

    ``loss-spike`` and ``exploding-gradient`` work on the log of the last ``history`` values: a value is a
    spike when it is over ``factor`` times their median and over their median by more than ``NOISE``
    median absolute deviations (the run's own noise), and nothing is judged before ``WARM_UP`` values.
    A cause of the whole model (a loss spike, every module's gradient at once) is one finding, and the
    ``SETTLE`` steps after it, while the update it made settles, are not judged.

    Args:
        layout: what is watched.
        window: steps a gradient may stay missing or zero before ``dead-gradient`` (two, for one that was
            there at each of the last ``SETTLED`` steps; ``max(2 * window, 3 * gap + 2)`` for one whose
            gradients, or a sibling's in a ModuleList / ModuleDict, came back after a gap of ``gap`` steps:
            routed experts, optional branches).
        explode_factor: a module's gradient norm over this many times the median of its last
            ``history`` norms (and over its noise) is ``exploding-gradient``.
        loss_factor: a logged loss over this many times the median of the last ``history`` positive
            losses (and over their noise) is a ``loss-spike``.
    """

    def __init__(self, layout: Layout, *, window: int = 5, explode_factor: float = 8.0,
                 loss_factor: float = 3.0, history: int = 50) -> None:
        self.layout = layout
        self.window = window
        self.explode_factor = explode_factor
        self.loss_factor = loss_factor
        self.jump = np.zeros(len(layout.modules))  # log growth over the largest of the last SUDDEN steps
        self.bias = np.array([n.rpartition(".")[2] == "bias" for n in layout.parameters], dtype=bool)
        self.biased = bool(self.bias.any())
        self.dead = np.zeros(len(layout.parameters), dtype=np.int64)  # steps in a row without a gradient
        self.streak = np.zeros(len(layout.parameters), dtype=np.int64)  # steps in a row with one
        self.lost = np.zeros(len(layout.parameters), dtype=np.int64)  # the streak the gradient lost
        # conditional computation (MoE experts, optional branches): siblings in a ModuleList share a group;
        # the longest gap after which a group's gradient came back is the group's own history
        keys = [_sibling_key(n) for n in layout.parameters]
        index = {k: i for i, k in enumerate(dict.fromkeys(keys))}
        self.group = np.array([index[k] for k in keys], dtype=np.int64)
        self.gap = np.zeros(len(index), dtype=np.int64)
        # log gradient norms per module, the last ``history`` steps: a ring of rows (the oldest row is
        # written over; the median does not care about the order), ``seen`` rows filled, the next at ``at``
        self.past = np.full((history, len(layout.modules)), np.nan)
        self.seen = self.at = 0
        self.low = np.full(len(layout.modules), np.nan)  # each module's lowest in the window (NaN: none)
        self.losses: deque[float] = deque(maxlen=history)  # log losses
        self.surge: tuple[Finding, str, float] | None = None  # this step's whole-model finding, whose, factor
        self.settling = 0  # steps left not judged after a whole-model spike
        self.quiet = False  # this step is one of them

    def loss(self, value: float, found: Sequence[Finding] = ()) -> list[Finding]:
        """``found`` (this step's other findings) with ``nonfinite-loss`` or ``loss-spike`` for the logged
        ``value`` added (not when ``found`` names the forward producer the loss only followed). A spike
        takes in this step's whole-model ``exploding-gradient``: one cause, one finding. A loss that is
        zero or negative is not judged."""
        surge, self.surge = self.surge, None
        if not math.isfinite(value) and any(f.code in NAMED_CAUSE for f in found):
            return list(found)  # its producer (a module, the batch, a written weight) is named already
        if not math.isfinite(value):
            return [*found, coded(
                "nonfinite-loss", LOSS_LABEL,
                f"the loss logged at this step is {value}: look for a log(0), a division by zero or a "
                "sqrt of a negative in the loss, a NaN or Inf in the batch, or an fp16 overflow (a "
                "larger loss scale, bf16); watch with nonfinite=True names the module that made it, "
                "if one did")]
        if value <= 0:
            return list(found)
        now = math.log(value)
        out = list(found)
        # a spike is over the median, and the median is at least the lowest value: a loss not over the lowest
        # by loss_factor is no spike, and the medians need not be worked out (most steps)
        if self.losses and not self.quiet and now - min(self.losses) > math.log(self.loss_factor):
            excess, threshold, median = (float(x[0]) for x in _excess(
                np.asarray(self.losses)[:, None], np.array([now]), self.loss_factor))
            if excess > threshold:
                with_it = ""
                if surge is not None:
                    out = [f for f in out if f is not surge[0]]
                    with_it = f"; {surge[1]} grew about {surge[2]:.3g}x with it"
                out.append(coded(
                    "loss-spike", ROOT_LABEL,
                    f"the loss is {value:.4g}, {math.exp(excess):.3g}x its median over the last "
                    f"{len(self.losses)} steps ({math.exp(median):.4g}){with_it}: look at this step's batch "
                    "and the gradient norms around it, or lower the learning rate"))
                self.settling = SETTLE
        self.losses.append(now)
        return out

    def gradients(
        self, param_grad: np.ndarray, has_grad: np.ndarray, module_grad: np.ndarray,
        zero: np.ndarray | None = None,
        unjudged: np.ndarray | None = None,
    ) -> list[Finding]:
        """``dead-gradient`` and ``exploding-gradient`` from one step's gradient norms (``zero``: no gradient
        or an all-zero one, per parameter, where the caller has it). Counted as present: the parameters
        ``unjudged`` marks, and an all-zero bias of a module whose other parameters have a non-zero
        gradient (the loss does not change with a shift of that module's output)."""
        if zero is None:
            zero = ~has_grad | (param_grad == 0)
        if self.biased and np.count_nonzero(zero):  # (new arrays: ``zero`` may be the caller's)
            flat = self.bias & has_grad & (param_grad == 0)
            if np.count_nonzero(flat):
                owner = self.layout.owner
                moving = has_grad & (param_grad > 0)
                mates = np.bincount(owner[moving], minlength=len(self.layout.modules)) > 0
                zero = zero & ~(flat & mates[owner])
        if unjudged is not None:
            zero = zero & ~unjudged
        # every gradient there, now and before (count_nonzero: .any() less its Python wrapper, every step)
        if self.window and not np.count_nonzero(zero) and not np.count_nonzero(self.dead):
            self.streak = self.streak + 1  # nothing missing to count (what the lines below come to then)
            return self._spikes(module_grad)
        # a gradient back after a gap (not the zero gradients of a start, as a LoRA A's while B is 0): its
        # group's gradients come and go. (``lost`` is above 0 only while a gradient is missing.)
        back = ~zero & (self.lost > 0)
        if back.any():
            np.maximum.at(self.gap, self.group[back], self.dead[back])
        self.lost = np.where(zero, np.where(self.dead == 0, self.streak, self.lost), 0)
        self.streak = np.where(zero, 0, self.streak + 1)
        self.dead = np.where(zero, self.dead + 1, 0)
        gap = self.gap[self.group]
        cut = (self.dead == CUT_AFTER) & (self.lost >= SETTLED) & (self.window > CUT_AFTER) & (gap == 0)
        out = self._dead(np.flatnonzero(cut), cut=True)
        out += self._dead(np.flatnonzero((self.dead == self.window) & (gap == 0) & ~cut), cut=False)
        late = (gap > 0) & (self.dead == np.maximum(2 * self.window, 3 * gap + 2))  # well past its own gaps
        if late.any():
            out += self._dead(np.flatnonzero(late), cut=False, gap=int(gap[late].max()))
        return out + self._spikes(module_grad)

    def _spikes(self, module_grad: np.ndarray) -> list[Finding]:
        """``exploding-gradient`` from one step's module gradient norms, and the step into the history."""
        out: list[Finding] = []
        now = _log(module_grad)  # finite or NaN: no arithmetic below raises a floating-point warning
        self.surge = None
        self.quiet, self.settling = self.settling > 0, max(self.settling - 1, 0)
        if self.seen and not self.quiet:
            past = self.past[:self.seen]
            # over a module's median by explode_factor needs over its lowest value by as much (the median is
            # not below the lowest): where no module is, the medians need not be worked out (most steps)
            over_low = now - self.low > math.log(self.explode_factor)
            if np.count_nonzero(over_low):
                last = past[(self.at - 1 - np.arange(min(SUDDEN, self.seen))) % len(self.past)]
                # the largest of the last steps' (NaN where a module had no gradient)
                recent = np.nanmax(np.where(np.isfinite(last), last, -np.inf), axis=0)
                self.jump = now - recent
                out = self._exploding(now, *_excess(past, now, self.explode_factor))
        # the window's lowest values, kept as rows come and go: worked out again over the window only when the
        # row written over held one of them (fmin.reduce over the window is what they always equal)
        full = self.seen == len(self.past)
        lowest_leaves = full and bool(np.count_nonzero(self.past[self.at] == self.low))
        self.past[self.at] = now
        self.at = (self.at + 1) % len(self.past)
        self.seen = min(self.seen + 1, len(self.past))
        self.low = np.fmin.reduce(self.past, axis=0) if lowest_leaves else np.fmin(self.low, now)
        return out

    def _dead(self, which: np.ndarray, cut: bool, gap: int = 0) -> list[Finding]:
        """``dead-gradient`` for the parameters ``which`` whose gradient went missing this step (``cut``: each
        after a settled run of gradients; ``gap``: the longest gap of a gradient that comes and goes, now
        missing for ``max(2 * window, 3 * gap + 2)`` steps): one finding each, or one for them all when they
        are more than ``GROUP_OVER`` (a detach() or a frozen path takes a whole part of the model at once)."""
        if not len(which):
            return []
        names = [self.layout.parameters[i] for i in which]
        lost = int(self.lost[which].min())
        one = len(names) <= GROUP_OVER
        steps = int(self.dead[which].max())
        came_and_went = (f" (its gradients came and went before, as a routed expert's or an optional "
                         f"branch's do, but were never missing for more than {gap} steps in a row)"
                         if gap else "")
        why = (f"had a gradient at each of the {lost} steps before and none, or an all-zero one, for the "
               f"last {CUT_AFTER}: something cut {'it' if one else 'them'} off (a detach(), a frozen path, a "
               "branch no longer taken)" if cut else
               f"had no gradient, or an all-zero one, for {steps} steps{came_and_went}: "
               f"{'it does' if one else 'they do'} not take part in the loss (an unused branch, a detach(), "
               f"a frozen path) or {'its gradient is' if one else 'their gradients are'} killed (dead ReLUs, "
               "a zero mask)")
        if one:
            return [coded("dead-gradient", n, f"{n} {why}") for n in names]
        modules = list(dict.fromkeys(n.rpartition(".")[0] for n in names))
        edge, after = self._edge(modules)
        text = f"{len(names)} parameters of {len(modules)} module(s) ({listed(modules)}) each {why}"
        if after:  # the module after it lost (part of) its gradient too: what it takes is zero
            text += (f". The gradient stops at {module_label(edge)}: its output is zero "
                     f"({module_label(after)}, which takes it, lost its gradient too), so its units are dead "
                     "(a ReLU or GELU that is never positive, a bias pushed far negative) or masked")
        elif edge:
            text += (f". The gradient stops at {module_label(edge)}'s output: everything before it lost "
                     "its own")
        return [coded("dead-gradient", self._first_of(edge) or names[0], text)]

    def _edge(self, modules: list[str]) -> tuple[str, str]:
        """Of the modules whose gradients went missing (model order): the last one whose parameters are all
        without a gradient now, where the gradient stops (one with a weight and a bias first: a module with
        a weight alone also loses it when only its input is zero); and the module after it when that one
        lost a gradient too (its input, ``edge``'s output, is zero), else ""."""
        dead = self.dead > 0
        owned: dict[str, list[int]] = {}
        for i, n in enumerate(self.layout.parameters):
            owned.setdefault(n.rpartition(".")[0], []).append(i)
        full = [m for m in modules if all(dead[i] for i in owned.get(m, []))]
        if not full:
            return "", ""
        edge = ([m for m in full if len(owned[m]) > 1] or full)[-1]
        order = list(owned)
        nxt = order[order.index(edge) + 1] if order.index(edge) + 1 < len(order) else ""
        return edge, nxt if nxt and any(dead[i] for i in owned[nxt]) else ""

    def _first_of(self, module: str) -> str:
        return next((n for n in self.layout.parameters if n.rpartition(".")[0] == module), "")

    def _exploding(self, now: np.ndarray, excess: np.ndarray, threshold: np.ndarray,
                   median: np.ndarray) -> list[Finding]:
        """``exploding-gradient``: one finding for the whole model when most judged modules are over
        their threshold or at least half grew over ``explode_factor`` (the loss or the batch grew, not
        one layer), and one per module out of line with that common growth."""
        judged = np.isfinite(excess)
        over = judged & (excess > threshold)
        out: list[Finding] = []
        if not over.any():
            return out
        ordered = np.sort(excess[judged])
        common = float(ordered[(len(ordered) - 1) // 2])  # the growth at least half the modules reached
        # most modules over their threshold, or at least half grown over explode_factor (some modules'
        # own noise hides the same growth): the whole model
        if over.sum() * 2 > judged.sum() or common > math.log(self.explode_factor):
            factor = math.exp(common)
            every = "every module's gradient" if over.sum() == judged.sum() else "the modules' gradients"
            whole = coded(
                "exploding-gradient", ROOT_LABEL,
                f"{every} grew about {factor:.3g}x at once ({int(over.sum())} of {int(judged.sum())} modules "
                "over their own threshold): the loss or the batch of this step, not one layer; look at this "
                "step's batch and loss, clip gradients or lower the learning rate")
            out.append(whole)
            self.surge, self.settling = (whole, every, factor), SETTLE
            over &= excess - common > threshold  # out of line with the rest
        # one module alone: only a sudden jump (over the square root of explode_factor times its last
        # SUDDEN steps), not a gradient that grew step by step to many times its early median (an
        # attention's query and key, near 0 while attention is uniform, then growing for real)
        over &= ~(self.jump <= math.log(self.explode_factor) / 2)
        # and one that matters: after the jump it holds at least SHARE of the step's gradient norm (an
        # attention key's gradient of 7e-4 beside others of 0.1 moves nothing, however much it grew)
        # (the norms are scaled by the largest, so their squares cannot overflow)
        norms = np.where(np.isfinite(now), np.exp(now - np.fmax.reduce(now)), 0.0)
        over &= norms >= SHARE * math.sqrt(float(np.sum(norms * norms)))
        for i in np.flatnonzero(over):
            name = self.layout.modules[i]
            out.append(
                coded(
                    "exploding-gradient",
                    module_label(name),
                    f"gradient norm of {name or 'the root module'} is {math.exp(excess[i]):.3g}x its median "
                    f"over the last {self.seen} steps ({math.exp(now[i]):.3g} vs "
                    f"{math.exp(median[i]):.3g}): lower its learning rate, clip gradients, or check its "
                    "input",
                )
            )
        return out

    def parameters(
        self, param_norm: np.ndarray, buffer_norm: np.ndarray, buffers: tuple[str, ...]
    ) -> list[Finding]:
        """``nonfinite-parameter`` for the parameters and buffers whose values hold NaN/Inf (one
        finding per kind, naming the first in model order and counting the others)."""
        out = []
        for names, norms, kind in (
            (self.layout.parameters, param_norm, "parameter"),
            (buffers, buffer_norm, "buffer"),
        ):
            bad = [names[i] for i in np.flatnonzero(np.isinf(norms) | np.isnan(norms))]
            if not bad:
                continue
            others = (
                f" (and {len(bad) - 1} other {kind}{'s' if len(bad) > 2 else ''}: {', '.join(bad[1:4])}"
                f"{', ...' if len(bad) > 4 else ''})"
            )
            out.append(
                coded(
                    "nonfinite-parameter",
                    bad[0],
                    f"{kind} {bad[0]}{others if len(bad) > 1 else ''} holds NaN/Inf values (not only its "
                    "gradient): the last optimizer step or a write into it made it so; every later "
                    "output that uses it is non-finite",
                )
            )
        return out


_INDEXED = re.compile(r"^(?:|.*_)(\d+)$")  # "3", "expert_3": an index among siblings ("fc1" is a name)


def _sibling_key(name: str) -> str:
    """``name`` with its last index replaced (``layers.0.experts.3.w1.weight`` ->
    ``layers.0.experts.*.w1.weight``, ``experts.expert_3.wi.weight`` -> ``experts.expert_*.wi.weight``): the
    same parameter of the siblings of one ModuleList or ModuleDict."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        m = _INDEXED.match(parts[i])
        if m:
            parts[i] = parts[i][:m.start(1)] + "*"
            return ".".join(parts)
    return name


def not_in_optimizer(names: tuple[str, ...], tensors: list, held: set[int]) -> list[Finding]:
    """``not-in-optimizer`` for each trainable parameter that no param group holds."""
    if len(names) != len(tensors):
        raise ValueError(f"{len(names)} names for {len(tensors)} tensors")
    inside = np.fromiter(map(held.__contains__, map(id, tensors)), dtype=bool, count=len(tensors))
    return [
        coded(
            "not-in-optimizer",
            n,
            f"{n} requires grad but no param group of the optimizer holds it: it never changes. Build "
            "the optimizer from model.parameters() after every change to the model (after "
            "load_state_dict(assign=True), .to(), or adding a layer)",
        )
        for n, t in ((names[i], tensors[i]) for i in np.flatnonzero(~inside).tolist())  # one look each, in C
        if t is not None
    ]
