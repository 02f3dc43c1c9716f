"""Run files reduced for display: the steps to draw, each finding once per episode, counts per code,
and the verdict a page, a report or the terminal opens with (the first error)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from ..runfiles.tables import Run, StepFinding
from ..utils.codes import ORIGINS, origin_first, recurs
from ..utils.findings import SEVERITY_ORDER, episode_starts
from ..utils.labels import module_label

RECUR_AFTER = 5  # steps a recurring finding of a check_step file must be away before it counts again


def main_steps(run: Run) -> pd.DataFrame:
    """One row per step for the loss and global-norm lines: the global norms of a ``check_step``
    file, else rank 0's rows (the lowest rank's where rank 0 is absent), by step."""
    if run.kind == "check":
        return run.totals
    steps = run.steps
    if not len(steps):
        return steps
    first = steps["rank"].min()
    return steps[steps["rank"] == first].drop_duplicates("step", keep="last").sort_values("step")


def first_findings(run: Run) -> list[StepFinding]:
    """Each finding at the step it began: once per (code, where, rank), and once per episode for the
    codes that recur (``exploding-gradient``, ``loss-spike``, ``nonfinite-*``;
    :func:`inspector.utils.findings.episode_starts`). A watch file stores just these; a ``check_step``
    file repeats a finding at every step it holds, so an episode there ends after ``RECUR_AFTER``
    steps without it."""
    ordered = sorted(run.findings, key=lambda f: f.step)
    clear = RECUR_AFTER if run.kind == "check" else 0
    starts = episode_starts(((f.step, f.rank, f.finding) for f in ordered), recurs, clear)
    return [StepFinding(step, rank, f.code, f.severity, f.where, f.message) for step, rank, f in starts]


def finding_counts(run: Run) -> pd.DataFrame:
    """How often each code began in the run (:func:`first_findings`): ``code, severity, count, first_step,
    last_step``, most frequent first.

    >>> import tempfile, pathlib
    >>> from inspector.watching import read_run, synthetic_run
    >>> folder = tempfile.TemporaryDirectory()
    >>> p = pathlib.Path(folder.name) / "r.inspect"
    >>> _ = synthetic_run(p, steps=40, modules=3)  # one explosion, at step 40 * 3 // 4
    >>> finding_counts(read_run(p)).values.tolist()
    [['exploding-gradient', 'warning', 1, 30, 30]]
    >>> folder.cleanup()
    """
    found = first_findings(run)
    frame = pd.DataFrame([(f.code, f.severity, f.step) for f in found], columns=["code", "severity", "step"])
    counts = frame.groupby(["code", "severity"], sort=False)["step"].agg(["count", "min", "max"])
    counts = counts.rename(columns={"min": "first_step", "max": "last_step"}).reset_index()
    return counts.sort_values("count", ascending=False, kind="stable").reset_index(drop=True)


CAUSES_FIRST = ORIGINS  # at one step, where a NaN/Inf began (a producer, a rank's batch or loss) leads


def ordered_findings(findings: Run | Iterable[StepFinding]) -> list[StepFinding]:
    """Findings most severe first (error, warning, info), then by step; at one step where a NaN/Inf began
    leads (``nonfinite-forward``, ``nonfinite-backward``, ``nonfinite-loss``: the producer, the rank whose
    batch or loss went non-finite), then that rank's other findings, then the other ranks' (what the
    gradient reduction spread to them); the rest keep their order. A :class:`Run` gives its
    :func:`first_findings` (each once per episode)."""
    found = origin_first(first_findings(findings) if isinstance(findings, Run) else list(findings))
    return sorted(found, key=lambda f: (SEVERITY_ORDER.get(f.severity, len(SEVERITY_ORDER)), f.step,
                                        f.code not in CAUSES_FIRST))


@dataclass(frozen=True)
class Verdict:
    """What a run comes to, in one line: its first error (``first``, None when there is none), how
    many findings of each severity began in it, and whether they come from several ranks (the line
    then names the rank, rank 0 too)."""

    first: StepFinding | None
    counts: dict[str, int]
    ranked: bool = False

    def line(self) -> str:
        """``First error: step 150 · nonfinite-forward at h.1.mlp.c_fc — <what happened>`` (``step 2 rank 1
        · ...`` on several ranks), or what the run holds instead (warnings only, information only,
        nothing)."""
        f = self.first
        if f is not None:
            at = f" rank {f.rank}" if f.rank is not None and (self.ranked or f.rank) else ""
            more = self.counts.get("error", 0) - 1
            tail = f" ({more:,} more error{'s' if more != 1 else ''} after it)" if more > 0 else ""
            where = module_label(f.where)
            return f"First error: step {f.step:,}{at} · {f.code} at {where} — {f.message}{tail}"
        warnings, infos = self.counts.get("warning", 0), self.counts.get("info", 0)
        if warnings:
            return f"No errors; {warnings:,} warning{'s' if warnings != 1 else ''}" + (
                f" and {infos:,} information finding{'s' if infos != 1 else ''}." if infos else ".")
        if infos:
            return f"No errors or warnings; {infos:,} information finding{'s' if infos != 1 else ''}."
        return "No findings: nothing went wrong at any recorded step."


def verdict(findings: Run | Iterable[StepFinding]) -> Verdict:
    """The first error of a run (or of a watch's ``result.findings``) and the count of each severity.

    >>> import tempfile, pathlib
    >>> from inspector.watching import read_run, synthetic_run
    >>> folder = tempfile.TemporaryDirectory()
    >>> p = pathlib.Path(folder.name) / "r.inspect"
    >>> _ = synthetic_run(p, steps=40, modules=3)  # one explosion at step 30: a warning, no error
    >>> verdict(read_run(p)).line()
    'No errors; 1 warning.'
    >>> folder.cleanup()
    """
    ordered = ordered_findings(findings)
    counts = {sev: sum(f.severity == sev for f in ordered) for sev in SEVERITY_ORDER}
    first = ordered[0] if ordered and ordered[0].severity == "error" else None
    ranked = findings.world_size > 1 if isinstance(findings, Run) else any(f.rank for f in ordered)
    return Verdict(first, counts, ranked)


def first_producer(run: Run) -> tuple[str, int] | None:
    """``(module, step)`` of the run's first ``nonfinite-forward`` (the module that first produced a
    NaN/Inf from finite inputs), or None: what the heatmap marks."""
    found = [f for f in run.findings if f.code == "nonfinite-forward"]
    first = min(found, key=lambda f: f.step) if found else None
    return (first.where, first.step) if first else None
