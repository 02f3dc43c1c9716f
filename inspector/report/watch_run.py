"""A watched run file as a Report: the run, its findings by step, the heatmap, one step's modules.

``python -m inspector report run.inspect -o run.html`` uses it; the Report renders to HTML,
JSON and Markdown like a model report.
"""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pandas as pd

from ..utils.findings import Finding, InspectorError
from ..watching import Run, StepFinding, first_producer, main_steps, ordered_findings, producer_of, verdict
from .data import ReportFigure, Section, Table, make_figure
from .model import Report

MAX_STEP_ROWS = 200
MAX_STEP_COLUMNS = 40  # step columns a report shows (a run may log 100,000 learning rates or scalar names)


def _thin(frame: pd.DataFrame, rows: int = MAX_STEP_ROWS) -> pd.DataFrame:
    """At most ``rows`` evenly spaced rows (the last kept)."""
    if len(frame) <= rows:
        return frame
    keep = np.unique(np.linspace(0, len(frame) - 1, rows).round().astype(int))
    return frame.iloc[keep]


def _focus_step(run: Run) -> int:
    """The step to show module by module: the first error finding's, else the last step."""
    errors = [f.step for f in run.findings if f.severity == "error"]
    return min(errors) if errors else int(run.steps["step"].max())


def _captures_section(run: Run) -> Section | None:
    """The stored inputs and outputs of the first ``nonfinite-forward`` producer, if any; a captures file
    that is damaged or forged is an ``error`` section saying so (the rest of the report stands)."""
    try:
        caps = run.captures
    except InspectorError as exc:
        return Section("captures", "Captures", status="error", note=str(exc))
    if caps is None:
        return None
    name, step, rank = producer_of(caps)
    columns = ["kind", "path", "shape", "dtype", "mean", "std", "min", "max", "nan", "inf"]
    stats = caps.stats[[c for c in columns if c in caps.stats.columns]]
    tables: tuple[Table, ...] = (Table.from_frame(f"Inputs and outputs of {name} at step {step}", stats,
                               "detached copies taken when it first produced NaN/Inf"),)
    if caps.skipped:
        tables += (Table.from_frame("Left out by the capture byte budget", caps.skipped_table),)
    return Section("captures", f"Captures of {name} at step {step}", facts={"module": name, "step": step,
                   "rank": rank, "bytes": caps.total_bytes}, tables=tables)


def _with_step(f: StepFinding) -> Finding:
    """The finding as the report lists it: its message opens with the step (and rank) it began at."""
    at = f"step {f.step:,}" + (f", rank {f.rank}" if f.rank else "")
    return Finding(f.code, f.severity, f.where, f"{at}: {f.message}")  # type: ignore[arg-type]


def watch_report(run: Run) -> Report:
    """Sections ``findings``, ``run``, ``modules`` of one watched run (see :func:`inspector.read_run`),
    and ``captures`` when the run stored a ``nonfinite-forward`` producer's inputs and outputs."""
    from ..figures import loss_norm_figure, norm_heatmap, run_norm_grid

    found = ordered_findings(run)
    steps = run.steps
    by_step = Table("Findings, most severe first, then by step",
                    ("step", "rank", "code", "severity", "where", "message"),
                    tuple((f.step, f.rank, f.code, f.severity, f.where, f.message) for f in found))
    held = steps.columns[steps.notna().any().to_numpy()] if len(steps) else steps.columns  # one pass
    columns = [c for c in held if c not in ("time", "loss_logged")]
    left_out = max(0, len(columns) - MAX_STEP_COLUMNS)
    columns = columns[:MAX_STEP_COLUMNS]
    facts = {
        "file": run.path,
        "model": run.meta.model,
        "world_size": run.world_size,
        "steps": int(steps["step"].nunique()) if len(steps) else 0,
        "modules": len(run.module_order),
        "parameters": len(run.meta.parameters),
        "every": run.meta.every,
        "checks": ", ".join(run.meta.checks),
        "complete": run.complete,
        "note": run.meta.note,
    }
    figures: tuple[ReportFigure, ...] = ()
    if len(steps):
        figures += (make_figure("Loss and gradient norm", loss_norm_figure(main_steps(run))),)
    if len(steps) and run.module_order:
        heat = norm_heatmap(run_norm_grid(run), producer=first_producer(run))
        figures += (make_figure("Gradient norm per module and step", heat),)
    overview = Section(
        "run",
        "Watched run",
        facts=facts,
        tables=(
            Table.from_frame(
                "Steps",
                _thin(steps[columns]),
                f"every step up to {MAX_STEP_ROWS} rows, else evenly spaced ones"
                + (f"; the first {MAX_STEP_COLUMNS} columns: {left_out:,} more (learning rates, logged "
                   "scalars) are in the run file" if left_out else ""),
            ),
            by_step,
        ),
        figures=figures,
        findings=tuple(_with_step(f) for f in found),
    )
    sections = [Section("findings", "Findings", note=verdict(found).line()), overview]
    if len(steps) and run.module_order:
        step = _focus_step(run)
        sections.append(Section("modules", f"Modules at step {step}",
                                tables=(Table.from_frame(f"Per module at step {step}", run.at(step)),)))
    captured = _captures_section(run)
    if captured is not None:
        sections.append(captured)
    return Report(
        model={"name": run.meta.model, "source": run.path, "device": "", "dtype": None, "checkpoint": None,
               "class": "watched run"},
        options={"world_size": run.world_size, "every": run.meta.every},
        sections=tuple(sections), created=datetime.now(UTC).isoformat(timespec="seconds"),
        environment={})
