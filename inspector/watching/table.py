"""The watch's rules in one table: which check runs at which event, in which order, with which codes.

:data:`WATCH_CHECKS` is an ordered list of :class:`Row`; a row's place is the order its check runs in
among the rows of its phase, and a row that must come after another says so once, in ``after``, with
the reason. The phases of one step, in order:

- ``open``: once, when the watch opens (``found`` is kept and reported at the first step);
- ``before-step``: when the optimizer's pre-step hook runs (or the gradients are declared ready);
- ``measured``: in the same hook, once the step's gradient norms are taken (collectives allowed;
  ``found`` is held for ``gathered``);
- ``after-step``: when the optimizer's post-step hook runs, on this rank's numbers (threaded on from
  ``before-step``'s);
- ``skipped``: when the AMP ``GradScaler`` given as ``scaler=`` skipped a step (its ``update()`` ran with
  no optimizer step since the last); ``found`` is recorded at once, on a row of no step;
- ``other-step``: when an optimizer the watch was not given steps parameters the watched optimizers
  hold, outside their own step; ``found`` is recorded at once;
- ``gathered``: after every rank's numbers and findings are gathered (``found``: a :class:`ByRank`);
- ``close``: when the watch closes (``found``: ``(rank, finding)`` pairs, in the order recorded).

Every finding a row adds must be one of its ``codes`` at the severity :data:`CODES` gives it
(:meth:`Checks.run` raises otherwise), so a check's severity is written only in the registry.
``docs/findings.md`` lists this table (:func:`table_markdown`), checked by a test.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from ..utils.codes import CODES
from ..utils.findings import Finding, InspectorError
from . import rules
from .events import PHASES, At, ByRank, Check, Kit, Phase


@dataclass(frozen=True)
class Row:
    """One check in the table: the class that checks (its docstring says when it fires; a classmethod
    ``build(kit)`` makes it, or returns None where it does not apply to this watch), and the codes it
    may report."""

    phase: Phase
    check: type
    codes: tuple[str, ...]
    after: tuple[type, ...] = ()  # rows of the same phase this one must follow,
    why: str = ""  # and the reason, said once here

    @property
    def name(self) -> str:
        return self.check.__name__

    def build(self, kit: Kit) -> Check | None:
        build = getattr(self.check, "build", None)
        return build(kit) if build is not None else self.check()


_REPLICAS = ("replica-drift", "replica-resynchronised", "gradient-not-synchronized", "gradient-far-off",
             "shard-imbalance", "nonfinite-gradient", "nonfinite-parameter")

WATCH_CHECKS: tuple[Row, ...] = (
    # -- open
    Row("open", rules.FrozenParameters, ("frozen-parameters",)),
    Row("open", rules.UnheldAtOpen, ("not-in-optimizer",)),
    # -- before the optimizer applies the step
    Row("before-step", rules.EvalMode, ("eval-mode-module",)),
    Row("before-step", rules.GradientsCleared, ("gradient-not-cleared",)),
    Row("before-step", rules.Membership, ("not-in-optimizer", "parameters-replaced")),
    Row("before-step", rules.Unfrozen, ("not-in-optimizer",)),
    Row("before-step", rules.OptimizerStepped, ("optimizer-not-stepped",)),
    Row("before-step", rules.TiesKept, ("tie-broken", "tie-weakened")),
    # -- the step's gradients measured, before the optimizer step
    Row("measured", rules.ReplicasAgree, _REPLICAS),
    # -- after the step, this rank's numbers
    Row("after-step", rules.WrittenWeights, ("nonfinite-parameter",)),
    Row("after-step", rules.Producers, ("nonfinite-forward", "nonfinite-backward")),
    Row("after-step", rules.ZeroGradientStep, ("zero-gradient-step",)),
    Row("after-step", rules.GradientNorms, ("dead-gradient", "exploding-gradient"),
        after=(rules.ZeroGradientStep,),
        why="a step on absent or all-zero gradients explains the missing gradients: no dead-gradient"),
    Row("after-step", rules.Loss, ("nonfinite-loss", "loss-spike"),
        after=(rules.WrittenWeights, rules.Producers, rules.GradientNorms),
        why="a named producer (a module, the batch, a written weight) explains a NaN/Inf loss, and a "
            "loss spike takes in the same step's whole-model exploding-gradient"),
    Row("after-step", rules.LearningRateRose, rules.LearningRateRose.codes,
        after=(rules.GradientNorms, rules.Loss),
        why="it adds the learning rate's rise to the spikes those rows found this step"),
    Row("after-step", rules.NonfiniteGradients, ("nonfinite-gradient",),
        after=(rules.WrittenWeights, rules.Producers, rules.Loss),
        why="NaN/Inf gradients that a producer, a written weight or a NaN/Inf loss explains are not a "
            "cause of their own"),
    Row("after-step", rules.UsedNonfiniteWeights, (), after=(rules.Producers, rules.NonfiniteGradients),
        why="it folds the producer only once the producer has explained this step's NaN/Inf gradients"),
    Row("after-step", rules.NonfiniteWeights, ("nonfinite-parameter",)),
    Row("after-step", rules.Updates, ("no-update",)),
    Row("after-step", rules.IdleGroups, ("no-update",)),
    Row("after-step", rules.StillModules, ("no-update",)),
    Row("after-step", rules.GradientsUsed, ()),
    # -- a step the GradScaler skipped
    Row("skipped", rules.ScalerSkips, ("scaler-skipping",)),
    # -- an optimizer the watch was not given stepped
    Row("other-step", rules.OptimizerLost, ("optimizer-lost",)),
    # -- every rank's numbers gathered
    Row("gathered", rules.SlowRanks, ("slow-rank",)),
    Row("gathered", rules.ReplicaFindingsPlaced, _REPLICAS),
    Row("gathered", rules.SpreadFolded, (), after=(rules.ReplicaFindingsPlaced,),
        why="the NaN/Inf gradients and weights the distributed check places are folded too"),
    # anywhere in its phase: it reads only the origin codes, which every rank's after-step rows found
    Row("gathered", rules.OriginFirst, ()),
    # -- close
    Row("close", rules.RankFailures, ("run-failed",)),
    Row("close", rules.RunFailed, ("run-failed",)),  # after the other ranks': the run file's row order
)


def _some(value: Any) -> bool:
    """Whether a phase's threaded value holds a finding (a :class:`ByRank` of empty lists does not)."""
    if isinstance(value, ByRank):
        return any(value.found) or any(value.quiet)
    return bool(value)


def _findings(value: Any) -> list[Finding]:
    """The findings in a phase's threaded value (a list, pairs, or a :class:`ByRank`)."""
    if isinstance(value, ByRank):
        return [f for fs in value.found for f in fs]
    return [f[1] if isinstance(f, tuple) else f for f in value]


class Checks:
    """The table's rows built for one watch (those that apply), run phase by phase."""

    def __init__(self, kit: Kit, table: tuple[Row, ...] | None = None) -> None:
        rows = WATCH_CHECKS if table is None else table
        built = [(row, row.build(kit)) for row in rows]
        self.by_phase: dict[str, list[tuple[Row, Check]]] = {p: [] for p in PHASES}
        for row, check in built:
            if check is not None:
                self.by_phase[row.phase].append((row, check))

    def attach(self, at: At, stack: ExitStack) -> None:
        """Each check's hooks and starting state, in table order; the exit stack undoes them."""
        for rows in self.by_phase.values():
            for _, check in rows:
                attach = getattr(check, "attach", None)
                if attach is not None:
                    attach(at, stack)

    def run(self, phase: Phase, at: At, found: Any) -> Any:
        """``found`` through every check of ``phase`` in order. A finding a row adds that is not one of
        its codes, or not at the registry's severity, raises: the table is wrong."""
        grouped = isinstance(found, ByRank)  # written in place by the rows: read before and after each
        for row, check in self.by_phase[phase]:
            if grouped:
                prior = _findings(found) if _some(found) else []
                found = check(at, found)
                now = _findings(found) if _some(found) else []
            else:  # a list: a row that found nothing hands back the list it was given, as it was, or []
                given, size = found, len(found)
                found = check(at, found)
                if not found or (found is given and len(found) == size):
                    continue  # nothing new (most rows, most steps): nothing to check
                prior, now = _findings(given), _findings(found)
            if not now:
                continue
            before = {id(f) for f in prior}
            for f in now:
                if id(f) not in before and (f.code not in row.codes or f.severity != CODES[f.code].severity):
                    raise InspectorError(
                        f"the watch's check {row.name!r} reported {f.code} ({f.severity}), which its row "
                        f"does not list at that severity (codes: {', '.join(row.codes) or 'none'})")
        return found


def table_markdown(table: tuple[Row, ...] = WATCH_CHECKS) -> str:
    """The table as Markdown, in its order: phase, check, codes (with their severity), when it fires
    (the check's docstring) and the ordering rule it carries."""
    lines = ["| phase | check | codes | fires when |", "|---|---|---|---|"]
    for row in table:
        text = " ".join((row.check.__doc__ or "").split()).replace("|", "/")
        codes = ", ".join(f"`{c}` ({CODES[c].severity})" for c in row.codes) or "none"
        if row.after:
            text += f" After {', '.join(r.__name__ for r in row.after)}: {row.why}."
        lines.append(f"| {row.phase} | {row.name} | {codes} | {text} |")
    return "\n".join(lines)


__all__ = ["Checks", "Row", "WATCH_CHECKS", "table_markdown"]
