"""Run files reduced for display: the steps to draw, each finding once per episode, counts per code."""

from __future__ import annotations

import pandas as pd

from ..runfiles.tables import Run, StepFinding
from ..utils.codes import recurs
from ..utils.findings import episode_starts

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
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "r.inspect"
    >>> _ = synthetic_run(p, steps=40, modules=3)  # one explosion, at step 40 * 3 // 4
    >>> finding_counts(read_run(p)).values.tolist()
    [['exploding-gradient', 'warning', 1, 30, 30]]
    """
    found = first_findings(run)
    frame = pd.DataFrame([(f.code, f.severity, f.step) for f in found], columns=["code", "severity", "step"])
    counts = frame.groupby(["code", "severity"], sort=False)["step"].agg(["count", "min", "max"])
    counts = counts.rename(columns={"min": "first_step", "max": "last_step"}).reset_index()
    return counts.sort_values("count", ascending=False, kind="stable").reset_index(drop=True)
