"""The checks of the other events: a step the GradScaler skipped, an optimizer the watch was not given,
every rank's numbers gathered, and the watch closing (:mod:`inspector.watching.rules`)."""


from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ...runfiles import StepFinding
from ...sharding.findings import ranks_of
from ...utils.codes import coded, lead_ranks
from ...utils.findings import Finding
from ...utils.labels import ROOT_LABEL
from ..checks import (
    failure_finding,
)
from ..clock import slow_ranks
from ..ranks import RanksApart

if TYPE_CHECKING:
    from ..events import At, ByRank, Kit, Placed

from .after import PRODUCED, SPREAD


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
        if self.skips == 1:  # the scale this run of skips began to overflow at, as its row records it
            self.first_scale = at.n.scale
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
        when = (f"after step {at.step - 1}, the last the watch saw: a new optimizer built mid-run" if at.step
                else "before the first step: the loop steps another optimizer than the one the watch was "
                     "given")
        return found + [coded(
            "optimizer-lost", ours[0] if ours else ROOT_LABEL,
            f"another optimizer ({type(at.other).__name__}, holding {len(names)} parameters, {len(ours)} of "
            f"them the watched optimizer's) stepped {when}. The "
            "watch follows the optimizer it was given, which no longer steps, so it lost track: the run "
            "file records no step from here. Hand it the new one with w.use_optimizer(new_optimizer)")]


# -- once every rank's numbers are gathered (``found`` per rank) --------------------------------
class SlowRanks:
    """``slow-rank``: a rank's time before the step's first collective is 1 s or more and 3x or more
    the median of the other ranks' (on one process there are none: nothing to compare)."""

    def __call__(self, at: At, found: ByRank) -> ByRank:
        if len(at.numbers_all) < 2:
            return found
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
    (a NaN loss that goes on from an earlier step does not lead), so every rank orders alike. One rank's
    findings need no order (rank order is the same)."""

    def __call__(self, at: At, found: ByRank) -> ByRank:
        if len(found.found) < 2:
            return found
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
