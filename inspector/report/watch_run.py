"""A watched run file as a Report: the run, its findings by step, the heatmap, one step's modules.

``python -m inspector report run.inspect -o run.html`` uses it; the Report renders to HTML,
JSON and Markdown like a model report.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from ..replaying import Replay
from ..utils.findings import Finding, InspectorError
from ..utils.labels import module_label
from ..watching import Run, StepFinding, first_producer, main_steps, ordered_findings, producer_of, verdict
from .data import ReportFigure, Section, Table, make_figure, plain
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


def replay_section(r: Replay) -> Section:
    """A replayed step: reproduced or not, the ops that made NaN/Inf (first on top) with module and line,
    the gradients per parameter (NaN/Inf first, then the largest), what each module output."""
    ops = Table("Ops that made NaN/Inf from finite inputs, first on top",
                ("phase", "op", "module", "line", "code", "inputs", "nan", "inf"),
                tuple((o.phase, o.op, o.module, o.source, o.code, "; ".join(i.text() for i in o.inputs),
                       o.nan, o.inf) for o in r.ops))
    grads = r.gradients[["name", "norm", "state"]].copy()
    grads["bad"] = grads["state"] == "nonfinite"
    grads = grads.sort_values(["bad", "norm"], ascending=[False, False]).drop(columns="bad")
    columns = ["module", "kind", "path", "shape", "dtype", "min", "max", "nan", "inf"]
    stats = r.captures.stats
    shown = stats[[c for c in columns if c in stats]].head(MAX_STEP_ROWS)
    tables = (ops, Table.from_frame(f"Gradients at step {r.step}", grads.head(MAX_STEP_ROWS),
                                    "NaN/Inf first, then the largest"),
              Table.from_frame("Module outputs and inputs, as replayed", shown,
                               "detached copies within the capture byte budget"))
    first = r.first
    facts = {"step": r.step, "rank": r.rank, "replay file": r.file,
             "reproduced": {True: "yes", False: "no", None: "no loss to compare"}[r.reproduced],
             "loss": plain(r.loss, None), "recorded loss": plain(r.recorded_loss, None),
             "tolerance": r.tolerance, "gradient norm": plain(r.grad_norm, None),
             "recorded gradient norm": plain(r.recorded_grad_norm, None),
             "first op": f"{first.op} in {first.module} at {first.source}" if first else "none",
             "batch with NaN/Inf": ", ".join(r.batch_nonfinite) or "none",
             "weights with NaN/Inf": ", ".join(r.weights_nonfinite[:5]) or "none"}
    return Section("replayed", f"Step {r.step}, replayed", note=r.verdict(), facts=facts, tables=tables,
                   findings=r.findings)


def _with_step(f: StepFinding) -> Finding:
    """The finding as the report lists it: its message opens with the step (and rank) it began at."""
    at = f"step {f.step:,}" + (f", rank {f.rank}" if f.rank else "")
    return Finding(f.code, f.severity, f.where, f"{at}: {f.message}")  # type: ignore[arg-type]


def verdict_line(findings: Run | Iterable[StepFinding]) -> str:
    """The verdict in one line: the first error (:func:`inspector.watching.verdict`), else the first
    warning (or information finding) in the same shape, what the Training page and a run report open
    with.

    >>> verdict_line([StepFinding(30, None, "exploding-gradient", "warning", "layers.1", "1000x its median")])
    'No errors. First warning: step 30 · exploding-gradient at layers.1 — 1000x its median'
    """
    ordered = ordered_findings(findings if isinstance(findings, Run) else list(findings))
    v = verdict(ordered)
    first = ordered[0] if ordered else None
    if first is None or first.severity == "error":
        return v.line()
    noun = "warning" if first.severity == "warning" else "information finding"
    more = v.counts.get(first.severity, 0) - 1
    at = f" rank {first.rank}" if first.rank else ""
    tail = f" ({more:,} more {noun}{'s' if more != 1 else ''} after it)" if more > 0 else ""
    return (f"No errors. First {noun}: step {first.step:,}{at} · {first.code} at "
            f"{module_label(first.where)} — {first.message}{tail}")


def watch_report(run: Run, replayed: Replay | None = None) -> Report:
    """Sections ``findings``, ``run``, ``modules`` of one watched run (see :func:`inspector.read_run`),
    ``captures`` when the run stored a ``nonfinite-forward`` producer's inputs and outputs, and ``replayed``
    for a step of it run again (:func:`inspector.replay`)."""
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
    sections = [Section("findings", "Findings", note=verdict_line(found)), overview]
    if len(steps) and run.module_order:
        step = _focus_step(run)
        sections.append(Section("modules", f"Modules at step {step}",
                                tables=(Table.from_frame(f"Per module at step {step}", run.at(step)),)))
    captured = _captures_section(run)
    if captured is not None:
        sections.append(captured)
    if replayed is not None:
        sections.append(replay_section(replayed))
    return Report(
        model={"name": run.meta.model, "source": run.path, "device": "", "dtype": None, "checkpoint": None,
               "class": "watched run"},
        options={"world_size": run.world_size, "every": run.meta.every},
        sections=tuple(sections), created=datetime.now(UTC).isoformat(timespec="seconds"),
        environment={})
