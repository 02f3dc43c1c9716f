"""A run file as a Report (:func:`run_report`); a ``check_step`` run's: the run, one section per rank,
the tensors of the last step.

``python -m inspector report run.inspect -o run.html`` and the Training page use it; the
Report renders to HTML, JSON and Markdown like a model report.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pandas as pd

from ..replaying import Replay
from ..runfiles import DistributedRun, rank_issues, records_of, unique_findings
from ..watching import Run, StepFinding, read_run
from .data import Section, Table, make_figure
from .model import Report
from .watch_run import verdict_line


def run_report(run: Run | DistributedRun | str | os.PathLike, replayed: Replay | None = None) -> Report:
    """The report of one run file, of either kind: ``run_report(read_run(path))`` and ``run_report(path)``
    work alike.

    A ``check_step`` run (a :class:`Run` of kind ``"check"``, or its ``check_run``) gets sections
    ``findings``, ``run``, ``rank-0`` ... ``rank-N``, ``tensors``; a watched run
    (:func:`inspector.watch`'s file) gets :func:`~inspector.report.watch_report`'s ``findings``,
    ``run``, ``modules`` (and ``captures``), and ``replayed`` when given a step of it run again
    (:func:`inspector.replay`).

    Raises:
        InspectorError: ``run`` is a path that is no run file (the message says which).
    """
    if isinstance(run, (str, os.PathLike)):
        run = read_run(run)
    if isinstance(run, Run) and run.check_run is None:
        from .watch_run import watch_report

        return watch_report(run, replayed)
    return _check_report(records_of(run))


def _check_report(run: DistributedRun) -> Report:
    """Sections ``findings``, ``run``, ``rank-0`` ... ``rank-N``, ``tensors`` of a ``check_step`` run."""
    from ..figures.distributed import grad_norm_figure, memory_figure

    first = run.checks[0]
    findings = tuple(f for _, f in unique_findings(run))
    seen_at = Table(
        "Findings by step",
        ("code", "where", "steps"),
        tuple((f.code, f.where, ", ".join(str(s) for s in steps)) for steps, f in unique_findings(run)),
    )
    overview = Section(
        "run", "Distributed run", facts={
            "file": run.path, "world_size": run.world_size, "backend": run.backend,
            "steps": len(run.steps), "first_step": int(run.steps["step"].iloc[0]),
            "last_step": int(run.steps["step"].iloc[-1]), "note": first.note,
            "parameter_elements": int(first.totals.param_numel or 0)},
        tables=(Table.from_frame("Steps", run.steps), seen_at),
        figures=(make_figure("Gradient norm per rank", grad_norm_figure(run.per_rank, run.steps)),
                 make_figure("Memory per rank", memory_figure(run.per_rank))),
        findings=findings)
    ranks = tuple(_rank_section(run, rank) for rank in sorted(run.per_rank["rank"].unique()))
    tensors = Section("tensors", f"Tensors at step {int(run.steps['step'].iloc[-1])}",
                      tables=(Table.from_frame("Tensors", _tensor_table(run.tensors)),))
    return Report(
        model={"name": run.path, "source": run.path, "device": run.backend, "dtype": None, "checkpoint": None,
               "class": "distributed run"},
        options={"world_size": run.world_size},
        sections=(Section("findings", "Findings", note=_verdict_line(run)), overview, *ranks, tensors),
        created=datetime.now(UTC).isoformat(timespec="seconds"),
        environment={"backend": run.backend})


def _verdict_line(run: DistributedRun) -> str:
    """The run's first error (the first step each finding was seen at), as the report opens with."""
    return verdict_line(StepFinding(min(steps), None, f.code, f.severity, f.where, f.message)
                        for steps, f in unique_findings(run))


def _rank_section(run: DistributedRun, rank: int) -> Section:
    rows = run.per_rank[run.per_rank["rank"] == rank].drop(columns=["rank"])
    last = rows.iloc[-1]
    issues = rank_issues(run, int(rank))
    return Section(
        f"rank-{int(rank)}", f"Rank {int(rank)}",
        facts={"parameter_elements": int(last["param_numel"]), "parameter_bytes": int(last["param_bytes"]),
               "gradient_bytes": int(last["grad_bytes"]), "buffer_bytes": int(last["buffer_bytes"]),
               "nonfinite_gradient_values": int(rows["nonfinite"].sum()),
               "tensors_where_it_stands_out": int(issues["tensor"].nunique())},
        tables=(Table.from_frame(f"Rank {int(rank)} by step", rows),
                Table.from_frame(f"Where rank {int(rank)} stands out", issues,
                                 "nonfinite gradient pieces, replicated tensors whose bits differ from the "
                                 "majority (or from each other, with no majority), and plain parameters "
                                 "whose gradients differ between ranks")))


def _tensor_table(tensors: pd.DataFrame) -> pd.DataFrame:
    out = tensors.copy()
    for col in ("mesh", "shape", "local_numel", "local_grad_norm", "nan", "inf"):
        out[col] = out[col].map(lambda v: " / ".join("" if x is None else f"{x:.4g}" if isinstance(x, float)
                                                     else str(x) for x in v) if isinstance(v, list) else v)
    return out
