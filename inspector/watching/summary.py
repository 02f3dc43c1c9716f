"""Run files reduced for display: the steps to draw, findings once each."""

from __future__ import annotations

import pandas as pd

from ..utils.findings import group_findings
from .run import Run, StepFinding


def main_steps(run: Run) -> pd.DataFrame:
    """One row per step for the loss and global-norm lines: the global norms of a ``check_step``
    file, else rank 0's rows (the lowest rank's where rank 0 is absent), by step."""
    if run.check_run is not None:
        return run.check_run.steps
    steps = run.steps
    if not len(steps):
        return steps
    first = steps["rank"].min()
    return steps[steps["rank"] == first].drop_duplicates("step", keep="last").sort_values("step")


def first_findings(run: Run) -> list[StepFinding]:
    """Each (code, where, rank) once (:func:`inspector.utils.findings.group_findings`): the step it first
    appeared."""
    ordered = sorted(run.findings, key=lambda f: f.step)
    groups = group_findings((f.step, f.rank, f.finding) for f in ordered)
    return [
        StepFinding(steps[0], rank, f.code, f.severity, f.where, f.message)
        for steps, rank, f in groups.values()
    ]
