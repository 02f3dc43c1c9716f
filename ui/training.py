"""The Training page's reading and tables: a run file by path or upload, read again only when it
changed, and its numbers in readable units."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from inspector import format_bytes
from inspector.distributed import rank_issues, unique_findings
from inspector.figures import (
    NormGrid,
    findings_timeline,
    grad_norm_figure,
    loss_norm_figure,
    memory_figure,
    run_norm_grid,
)
from inspector.utils import InspectorError, grid_frame, markdown_text
from inspector.watching import (
    MODULE_COLUMNS,
    LiveRun,
    Run,
    is_watch_file,
    ordered_findings,
    parse_run_bytes,
    read_run,
)
from inspector.watching import main_steps as run_main_steps
from ui.tables import message_layout, paged_table

NORM_FORMAT = "%.4g"
BYTES_COLUMNS = (
    "param_bytes",
    "grad_bytes",
    "buffer_bytes",
    "device_allocated",
    "device_peak",
    "rss",
    "peak_rss",
)
NORM_COLUMNS = ("grad_norm", "param_norm", "update_ratio", "local_grad_norm", "loss")
GRAD_COLUMNS = ("grad_norm", "local_grad_norm")
NONFINITE_GRADIENT = "first NaN/Inf gradient"  # the first module, in module order
PRODUCER = "produced the NaN/Inf"  # the module of the step's nonfinite-forward finding
LABELS = {
    "grad_norm": "gradient norm",
    "param_norm": "parameter norm",
    "update_ratio": "update ratio ‖Δw‖/‖w‖",
    "local_grad_norm": "local gradient norm",
    "nonfinite": "NaN/Inf gradient values",
}


@dataclass(frozen=True)
class Opened:
    """A run as the page shows it (either kind: ``run.kind``).

    ``key`` changes whenever the file does (path, size, modification time; or the upload's id).
    """

    key: tuple[Any, ...]
    run: Run


@st.cache_resource(show_spinner=False, max_entries=4)
def _read_path(path: str, size: int, mtime_ns: int) -> Opened:
    return Opened((path, size, mtime_ns), read_run(path))


@st.cache_resource(show_spinner=False, max_entries=8)
def _live(path: str) -> LiveRun:
    """One follower per watch run file, shared by every session: each read adds only the new steps."""
    return LiveRun(path)


@st.cache_resource(show_spinner=False, max_entries=4)
def _read_upload(name: str, file_id: str, _data: bytes) -> Opened:
    return Opened((name, file_id), parse_run_bytes(_data, name))


def open_run(upload: Any, path: str) -> Opened | None:
    """The run of ``upload`` (wins) or of the server ``path``; None when neither is given.

    A watch run file is followed (:class:`~inspector.watching.LiveRun`): each refresh reads only the
    steps appended since the last one, and the run is rebuilt only when there are some. A JSON-lines
    run file is read again only when its size or modification time changed.
    """
    if upload is not None:
        return _read_upload(upload.name, upload.file_id, upload.getvalue())
    if not path.strip():
        return None
    from ui.runs import checked_path

    p = checked_path(path.strip())  # only under the runs folders or the upload folder
    if is_watch_file(p):  # an Arrow run file: read on from where the last read stopped
        live = _live(p)
        run = live.read()
        return Opened(live.key, run)
    try:
        st_ = os.stat(p)
    except OSError:
        return _read_path(p, -1, -1)  # read_run names the missing file
    return _read_path(p, st_.st_size, st_.st_mtime_ns)


def file_key(path: str) -> tuple[int, int] | None:
    """``(size, mtime_ns)`` of the run file at ``path`` (checked against the runs folders), None when
    it is not there or not allowed: what the Training page compares to follow a run."""
    from ui.runs import checked_path

    try:
        stat = os.stat(checked_path(path.strip()))
    except (OSError, InspectorError):
        return None
    return stat.st_size, stat.st_mtime_ns


@st.cache_resource(show_spinner=False, max_entries=16)
def norm_grid_of(_opened: Opened, key: tuple[Any, ...], column: str, rank: int) -> NormGrid:
    """The heatmap's grid of ``column`` on ``rank`` (computed once per file version)."""
    return run_norm_grid(_opened.run, column, rank)


@st.cache_resource(show_spinner=False, max_entries=8)
def loss_figure_of(_opened: Opened, key: tuple[Any, ...]) -> Any:
    """The loss and global-norm figure of a run, built once per file version (a step picked, a rerun
    of an unchanged file, reuse it: the figure does not depend on them; ``st.plotly_chart`` copies it)."""
    return loss_norm_figure(run_main_steps(_opened.run))


@st.cache_resource(show_spinner=False, max_entries=8)
def timeline_of(_opened: Opened, key: tuple[Any, ...], first: int, last: int) -> Any:
    """The findings timeline of a run over steps ``first``..``last``, built once per file version."""
    return findings_timeline(findings_frame(_opened.run), (first, last))


def clear_cache() -> None:
    """Forget every run read, grid binned and figure built (the next open reads the file again)."""
    _read_path.clear()
    _read_upload.clear()
    _live.clear()
    norm_grid_of.clear()
    loss_figure_of.clear()
    timeline_of.clear()


def findings_frame(run: Run) -> pd.DataFrame:
    """Every finding of the run with its step and rank, most severe first, then by step
    (:func:`inspector.watching.ordered_findings`)."""
    rows = [(f.step, f.rank, f.severity, f.code, f.where, f.message) for f in ordered_findings(run.findings)]
    return pd.DataFrame(rows, columns=["step", "rank", "severity", "code", "where", "message"])


def findings_layout(found: pd.DataFrame) -> dict[str, Any]:
    """Table settings that show each finding's message whole: wrapped in the room the other columns
    (fitted to their text) leave of the page's width, at least ``MESSAGE_PX`` less a third."""
    return message_layout(found, {"code": st.column_config.TextColumn(width="medium")})


def main_steps(opened: Opened) -> pd.DataFrame:
    """One row per step for the loss and global-norm lines (:func:`inspector.watching.main_steps`)."""
    return run_main_steps(opened.run)


def nearest_step(steps: np.ndarray, wanted: int) -> int:
    """The recorded step closest to ``wanted`` (the earlier one on a tie)."""
    i = int(np.searchsorted(steps, wanted))
    if i >= len(steps):
        return int(steps[-1])
    if i == 0 or steps[i] == wanted:
        return int(steps[i])
    return int(steps[i - 1] if wanted - steps[i - 1] <= steps[i] - wanted else steps[i])


def readable(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    """``frame`` for people: byte columns in binary units, norms to four significant digits
    (the column settings to pass to the table), empty cells for values not taken, a gradient norm
    that is NaN because its gradient held NaN/Inf written as such, and columns named in words."""
    out = frame.copy()
    config: dict[str, Any] = {}
    bad = _nonfinite_rows(out)
    for col in out.columns:
        label = LABELS.get(col)
        if col in BYTES_COLUMNS:
            out[col] = [format_bytes(v) if v is not None and v == v else "" for v in out[col]]
        elif (
            col in GRAD_COLUMNS and pd.api.types.is_numeric_dtype(out[col]) and (bad & out[col].isna()).any()
        ):
            out[col] = [
                "NaN/Inf" if b and v != v else _norms_text(v) for v, b in zip(out[col], bad, strict=True)
            ]
        elif col in NORM_COLUMNS and pd.api.types.is_numeric_dtype(out[col]) and out[col].notna().all():
            config[col] = st.column_config.NumberColumn(label, format=NORM_FORMAT)
        elif col in NORM_COLUMNS:  # a value not taken is an empty cell (the grid writes a null "None")
            out[col] = [_norms_text(v) for v in out[col]]
        elif col == "nonfinite" and pd.api.types.is_numeric_dtype(out[col]) and out[col].notna().all():
            config[col] = st.column_config.NumberColumn(label, format="%d")
        elif col == "nonfinite":
            out[col] = ["" if v != v or v is None else f"{int(v):,}" for v in out[col]]
        if label and col not in config:
            config[col] = st.column_config.Column(label)
    return out, config


def _nonfinite_rows(frame: pd.DataFrame) -> pd.Series:
    """True on the rows whose ``nonfinite`` count (NaN/Inf gradient values) is above 0."""
    if "nonfinite" not in frame.columns or not pd.api.types.is_numeric_dtype(frame["nonfinite"]):
        return pd.Series(False, index=frame.index)
    return frame["nonfinite"].fillna(0) > 0


def _norms_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ", ".join(_norms_text(v) for v in value)
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return f"{value:.4g}" if isinstance(value, (int, float)) else str(value)


def column_label(column: str) -> str:
    """A per-module column in words: ``grad_norm`` -> ``gradient norm``."""
    return LABELS.get(column, column.replace("_", " "))


def available_columns(run: Run) -> list[str]:
    """The per-module numbers this run recorded (``grad_norm`` first), of ``MODULE_COLUMNS``."""
    table = run.table
    out = [name for name, col in MODULE_COLUMNS.items()
           if name != "nonfinite" and table.num_rows and table.column(col).null_count < table.num_rows]
    return out or ["grad_norm"]


def modules_at(run: Run, step: int, rank: int) -> pd.DataFrame:
    """``run.at(step, rank)`` with a column for every per-module number the run recorded at any step
    (empty where not taken), so the table keeps its columns at a NaN step."""
    table = run.at(step, rank)
    for col in available_columns(run):
        if col not in table.columns:
            table[col] = np.nan
    order = ["module", *MODULE_COLUMNS]
    return table[[c for c in order if c in table.columns] + [c for c in table.columns if c not in order]]


def step_marks(run: Run, step: int, rank: int, table: pd.DataFrame) -> dict[str, str]:
    """What the step view says beside a module at ``step``: each finding of that step at its module
    (the ``nonfinite-forward`` producer by the name the finding used, a module without parameters
    too), and the first module in order whose gradient holds NaN/Inf."""
    marks: dict[str, str] = {}
    meta = run.meta
    owner = dict(zip(meta.parameters, (meta.modules[i] for i in meta.parameter_modules), strict=True))
    for f in ordered_findings(run):
        if f.step == step and (f.rank in (None, rank) or run.world_size == 1):
            said = PRODUCER if f.code == "nonfinite-forward" else f.code
            named = f.where in marks or f.code == "nonfinite-forward"  # a producer keeps the finding's name
            where = f.where if named else owner.get(f.where, f.where)
            if said not in marks.get(where, "").split("; "):
                marks[where] = f"{marks[where]}; {said}" if where in marks else said
    if "nonfinite" in table.columns:
        bad = table.loc[table["nonfinite"].fillna(0) > 0, "module"]
        if len(bad):
            name = str(bad.iloc[0])
            marks[name] = f"{marks[name]}; {NONFINITE_GRADIENT}" if name in marks else NONFINITE_GRADIENT
    return marks


def marked_table(table: pd.DataFrame, marks: dict[str, str]) -> pd.DataFrame:
    """``table`` with a ``mark`` column first and the marked modules on top (in the order of their
    marks); a marked module the table lacks (one without parameters) gets a row of its own."""
    if not marks:
        return table
    extra = [m for m in marks if m not in set(table["module"])]
    out = pd.concat([table, pd.DataFrame({"module": extra})], ignore_index=True) if extra else table.copy()
    out.insert(0, "mark", [marks.get(m, "") for m in out["module"]])
    if extra:
        out.loc[out["module"].isin(extra), "mark"] += " (no parameters)"
    order = {m: i for i, m in enumerate(marks)}
    rank = out["module"].map(lambda m: order.get(m, len(order)))
    return out.iloc[rank.argsort(kind="stable")].reset_index(drop=True)


@dataclass(frozen=True)
class StepView:
    """What the step view shows: the modules at ``step`` (marked ones first, readable cells), the
    column settings, and the per-module numbers not taken at that step."""

    step: int
    table: pd.DataFrame
    config: dict[str, Any]
    missing: tuple[str, ...]


def step_view(run: Run, step: int, rank: int) -> StepView:
    """The step view's data: :func:`modules_at` with :func:`step_marks`, in words (:func:`readable`)."""
    at = modules_at(run, step, rank)
    missing = tuple(column_label(c) for c in available_columns(run)
                    if c != "grad_norm" and at[c].isna().all())
    table, config = readable(marked_table(at, step_marks(run, step, rank, at)))
    return StepView(step, table, config, missing)


def rank_steps(run: Run, rank: int) -> np.ndarray:
    """The sorted step numbers recorded for ``rank``."""
    steps = run.steps
    return np.unique(steps.loc[steps["rank"] == rank, "step"].to_numpy())


@dataclass(frozen=True)
class CheckRanksView:
    """The ranks of a ``check_step`` run at one step, as the page shows them: the findings by tensor
    (``code, where, steps``; empty when none), the norm and memory figures, the rows where ``rank``
    stands out (``issues``), its rows and the tensors at step ``at`` (cells readable, with their column
    settings)."""

    caption: str
    findings: pd.DataFrame
    norms: Any
    memory: Any
    at: int
    rank: int
    issues: pd.DataFrame
    rows: pd.DataFrame
    rows_config: dict[str, Any]
    tensors: pd.DataFrame
    tensors_config: dict[str, Any]


def check_ranks_view(dist: Run, step: int, rank: int) -> CheckRanksView:
    """The data of :func:`draw_check_ranks` for a ``check_step`` run (a :class:`Run` of kind ``"check"``)."""
    found = unique_findings(dist)
    findings = pd.DataFrame([{"code": f.code, "where": f.where, "steps": ", ".join(map(str, s))}
                             for s, f in found], columns=["code", "where", "steps"])
    caption = (f"{dist.world_size} ranks on {markdown_text(dist.backend)}. Each rank's gradient norm is the "
               "norm of the pieces it holds; the pale band is the global norm (what `clip_grad_norm_` "
               "returns). A gap in a rank's line is a step where its gradients were not finite.")
    at = nearest_step(np.unique(dist.per_rank["step"].to_numpy()), step)
    rows, rows_config = readable(dist.per_rank[dist.per_rank["rank"] == rank])
    tensors, tensors_config = readable(dist.tensors_at(at).drop(columns=["mesh"]))
    tensors = tensors.astype({c: str for c in tensors.columns if c not in tensors_config})
    return CheckRanksView(caption, findings, grad_norm_figure(dist.per_rank, dist.totals),
                          memory_figure(dist.per_rank, at), at, rank, rank_issues(dist, rank), rows,
                          rows_config, tensors, tensors_config)


def draw_check_ranks(view: CheckRanksView) -> None:
    """Draw :func:`check_ranks_view`'s data: findings by tensor, norms and memory per rank, where the rank
    stands out, its rows and the tensors at the step."""
    st.header("Ranks")
    st.caption(view.caption)
    if len(view.findings):
        st.dataframe(grid_frame(view.findings), hide_index=True, width="stretch")
    st.plotly_chart(view.norms, width="stretch")
    st.plotly_chart(view.memory, width="stretch")
    if len(view.issues):
        st.warning(f"Rank {view.rank} stands out at {len(view.issues)} (step, tensor) places.")
        st.dataframe(grid_frame(view.issues), hide_index=True, width="stretch")
    else:
        st.success(f"Rank {view.rank} agrees with its replicas and has finite gradients at every step.")
    st.dataframe(grid_frame(view.rows), hide_index=True, width="stretch", column_config=view.rows_config)
    st.subheader(f"Tensors at step {view.at:,}")
    paged_table(view.tensors, key="dist_tensors", column_config=view.tensors_config)


def distributed_part(dist: Run, step: int, rank: int) -> None:
    """The ranks of a ``check_step`` run side by side (:func:`check_ranks_view`, drawn)."""
    draw_check_ranks(check_ranks_view(dist, step, rank))


@dataclass(frozen=True)
class WatchRanksView:
    """The ranks of a watched run at one step: the gradient norm figure, the memory figure (None when
    the run recorded no memory numbers), and every rank's row at step ``at`` (readable, with settings)."""

    norms: Any
    memory: Any | None
    at: int
    rows: pd.DataFrame
    rows_config: dict[str, Any]


def watch_ranks_view(run: Run, step: int) -> WatchRanksView:
    """The data of :func:`draw_watch_ranks`: each rank's gradient norm, memory and numbers at ``step``
    (the nearest recorded one)."""
    per_rank = run.steps
    at = nearest_step(np.unique(per_rank["step"].to_numpy()), step)
    memory = [c for c in ("device_allocated", "device_peak", "rss") if per_rank[c].notna().any()]
    rows, config = readable(per_rank[per_rank["step"] == at])
    return WatchRanksView(grad_norm_figure(per_rank[["step", "rank", "grad_norm"]], None),
                          memory_figure(per_rank, at) if memory else None, at, rows, config)


def draw_watch_ranks(view: WatchRanksView) -> None:
    """Draw :func:`watch_ranks_view`'s data."""
    st.header("Ranks")
    st.caption("Each rank's line is the gradient norm it recorded; memory is each rank's process and device.")
    st.plotly_chart(view.norms, width="stretch")
    if view.memory is not None:
        st.plotly_chart(view.memory, width="stretch")
    else:
        st.caption("This run recorded no memory numbers.")
    st.dataframe(grid_frame(view.rows), hide_index=True, width="stretch", column_config=view.rows_config)


def watch_ranks_part(run: Run, step: int) -> None:
    """The ranks of a watched run side by side (:func:`watch_ranks_view`, drawn)."""
    draw_watch_ranks(watch_ranks_view(run, step))


def run_ranks(opened: Opened) -> list[int]:
    """The ranks with steps in the opened run, in order."""
    return sorted(int(r) for r in opened.run.steps["rank"].unique())


def picked_step(opened: Opened, rank: int) -> int | None:
    """The step picked (by a button, a finding, the address or by hand), None while following the latest."""
    if st.session_state.get("train_latest", True) or "train_step" not in st.session_state:
        return None
    return nearest_step(rank_steps(opened.run, rank), int(st.session_state["train_step"]))


def watch_file(path: str, seen: tuple[int, int] | None) -> None:
    """Every ``REFRESH_S`` while a run is followed: one ``stat`` of the file, and the page runs again
    only when its size or modification time changed (a run that stands still costs nothing more)."""
    if file_key(path) != seen:
        st.rerun(scope="app")


SCROLL_TO_STEP = "<script>document.getElementById('step')?.scrollIntoView({block: 'nearest'});</script>"


def step_part(opened: Opened, step: int, rank: int) -> None:
    """The modules at one step: the producer and the first NaN/Inf gradient marked and on top."""
    view = step_view(opened.run, step, rank)
    st.subheader(f"Modules at step {step:,}", anchor="step")
    if st.session_state.pop("train_scroll", False):  # picked lower on the page: bring the view into sight
        st.html(SCROLL_TO_STEP, unsafe_allow_javascript=True)
    if view.missing:
        st.caption(f"Not taken at this step: {', '.join(view.missing)} (a step whose gradients held NaN/Inf "
                   "records no parameter norm or update ratio).")
    paged_table(view.table, "train_modules", column_config=view.config, filter_columns=["module"])
