"""A run file as tables: :class:`Run` (what :func:`~.reading.read_run` gives) and :class:`StepFinding`."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from ..capture import Captures
from ..utils.findings import Finding, InspectorError
from ..utils.labels import module_label
from .columns import RunMeta
from .run import DistributedRun

STEP_COLUMNS = ["step", "rank", "time", "step_time", "loss", "grad_norm", "nonfinite", "scale", "skipped",
                "device_allocated", "device_peak", "rss"]
MODULE_COLUMNS = {"grad_norm": "module_grad_norm", "param_norm": "module_param_norm",
                  "update_ratio": "module_update_ratio", "nonfinite": "module_nonfinite"}


@dataclass(frozen=True)
class StepFinding:
    """A finding with the step (and rank; None for the whole world) where it first appeared."""

    step: int
    rank: int | None
    code: str
    severity: str
    where: str
    message: str

    @property
    def finding(self) -> Finding:
        return Finding(self.code, self.severity, self.where, self.message)  # type: ignore[arg-type]

    def line(self) -> str:
        """One line for a log or terminal: ``step 12 rank 1 · error · nonfinite-gradient at h.0: ...``."""
        return finding_line(self.step, self.severity, self.code, self.where, self.message, self.rank)


def finding_line(step: int, severity: str, code: str, where: str, message: str,
                 rank: int | None = None) -> str:
    """The one way a step's finding is written as a line (the CLI, the training callbacks, trackers)."""
    at = f" rank {rank}" if rank else ""
    return f"step {step}{at} · {severity} · {code} at {module_label(where)}: {message}"


@dataclass(frozen=True, eq=False)
class Run:
    """A training run, as tables (see :func:`~.reading.read_run`): the file :func:`inspector.watch` writes
    (``kind`` ``"watch"``) or the one ``check_step`` writes (``kind`` ``"check"``).

    For either kind: ``steps``: one row per (step, rank): ``STEP_COLUMNS``, ``loss_logged`` (a NaN
    ``loss`` was logged as NaN where it is true), then ``lr_0, lr_1, ...`` (one per param group) and
    one column per scalar logged with ``w.log``. ``modules`` (built on first use): one row per
    (step, rank, module) with ``grad_norm, param_norm, update_ratio, nonfinite``; :meth:`matrix`
    gives one of them as a steps × modules array without building it. ``findings``: each with its
    step and rank. ``complete`` is False while the file is still being written, when the writer
    died, or when the run ended by an exception (``failure``); every complete step is read either way.
    ``world_size``: the ranks of the run.

    A ``check_step`` run also has what only it records: ``per_rank`` (one row per (step, rank) of
    check_step's numbers: bytes held, memory, local gradient norm), ``totals`` (one row per step:
    the whole world's ``step, grad_norm, nonfinite, findings``), ``tensors`` (the last step's
    tensors; :meth:`tensors_at` another step's), ``backend``, and ``check_run``, the typed records
    (:class:`~inspector.distributed.DistributedRun`); its ``steps`` and ``modules`` hold each rank's
    numbers with every module's global gradient norm. On a watched run those raise
    :class:`InspectorError` and ``check_run`` is None.
    """

    path: str
    meta: RunMeta
    steps: pd.DataFrame = field(repr=False)
    findings: list[StepFinding]
    complete: bool
    table: Any = field(repr=False)  # the pyarrow.Table of the rows
    source: str = ""  # the file's full path ("" for an upload)
    check_run: DistributedRun | None = field(default=None, repr=False)  # a check_step run's records

    @property
    def failure(self) -> StepFinding | None:
        """The ``run-failed`` finding when the run ended by an exception (its type, message and step)."""
        return next((f for f in self.findings if f.code == "run-failed"), None)

    @property
    def kind(self) -> str:
        """``"watch"`` (:func:`inspector.watch`'s file) or ``"check"`` (``check_step``'s)."""
        return self.meta.kind

    def _checked(self, what: str) -> DistributedRun:
        if self.check_run is None:
            raise InspectorError(
                f"{self.path} is a watched run: {what} is what inspector.distributed.check_step records, "
                "not inspector.watch; a watched run's numbers per rank are in run.steps"
            )
        return self.check_run

    @property
    def per_rank(self) -> pd.DataFrame:
        """A ``check_step`` run's numbers per (step, rank): ``step, rank, grad_norm`` (of the rank's pieces),
        ``nonfinite, param_numel, param_bytes, grad_bytes, buffer_bytes, device_allocated, device_peak,
        rss, peak_rss, value_nonfinite, loss``."""
        return self._checked("per_rank").per_rank

    @property
    def totals(self) -> pd.DataFrame:
        """A ``check_step`` run's whole-world numbers, one row per step: ``step, grad_norm`` (the global
        norm, what ``clip_grad_norm_`` returns), ``nonfinite, findings`` (how many)."""
        return self._checked("totals").steps

    @property
    def tensors(self) -> pd.DataFrame:
        """A ``check_step`` run's tensors at its last step (placements, mesh, norms, NaN/Inf by rank)."""
        return self._checked("tensors").tensors

    def tensors_at(self, step: int) -> pd.DataFrame:
        """A ``check_step`` run's tensors at ``step`` (the last record with that step number)."""
        return self._checked("tensors_at").tensors_at(step)

    @property
    def backend(self) -> str:
        """The process group's backend of a ``check_step`` run (``gloo``, ``nccl``)."""
        return self._checked("backend").backend

    @cached_property
    def captures(self) -> Captures | None:
        """The inputs and outputs of the first ``nonfinite-forward`` producer, stored next to the
        run file (:func:`~.captured.read_captures`); None when there are none."""
        from .captured import read_captures

        return read_captures(self.source) if self.source else None

    @property
    def module_order(self) -> tuple[str, ...]:
        return self.meta.modules

    @property
    def world_size(self) -> int:
        return self.meta.world_size

    def matrix(self, column: str = "grad_norm", rank: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)``: the step numbers of ``rank`` and a float array of shape
        ``(len(steps), len(module_order))`` of the per-module ``column`` (NaN where not taken).

        Raises:
            InspectorError: ``column`` is not one of ``grad_norm, param_norm, update_ratio, nonfinite``.
        """
        if column not in MODULE_COLUMNS:
            raise InspectorError(f"module column {column!r} is not one of {', '.join(MODULE_COLUMNS)}")
        ranks = self.table.column("rank").to_numpy()
        rows = np.flatnonzero(ranks == rank)
        sub = self.table.take(rows) if len(rows) != len(ranks) else self.table
        values = _list_matrix(sub.column(MODULE_COLUMNS[column]), len(self.meta.modules), self.path)
        return sub.column("step").to_numpy(), values

    @cached_property
    def modules(self) -> pd.DataFrame:
        """One row per (step, rank, module); ``module`` is categorical in ``module_order``."""
        n_mod = len(self.meta.modules)
        n_rows = self.table.num_rows
        out = {
            "step": np.repeat(self.table.column("step").to_numpy(), n_mod),
            "rank": np.repeat(self.table.column("rank").to_numpy(), n_mod),
            "module": pd.Categorical.from_codes(np.tile(np.arange(n_mod), n_rows),
                                                categories=pd.Index(self.meta.modules, dtype=object)),
        }
        for name, col in MODULE_COLUMNS.items():
            out[name] = _list_matrix(self.table.column(col), n_mod, self.path).reshape(-1)
        return pd.DataFrame(out)

    @cached_property
    def parameters(self) -> pd.DataFrame:
        """One row per (step, rank, parameter): ``step, rank, parameter, module, grad_norm``."""
        n_par = len(self.meta.parameters)
        n_rows = self.table.num_rows
        owners = [self.meta.modules[i] for i in self.meta.parameter_modules]
        codes = np.tile(np.arange(n_par), n_rows)
        return pd.DataFrame(
            {
                "step": np.repeat(self.table.column("step").to_numpy(), n_par),
                "rank": np.repeat(self.table.column("rank").to_numpy(), n_par),
                "parameter": pd.Categorical.from_codes(
                    codes, categories=pd.Index(self.meta.parameters, dtype=object)
                ),
                "module": np.asarray(owners, dtype=object)[codes] if n_par else np.zeros(0, dtype=object),
                "grad_norm": _list_matrix(self.table.column("param_grad_norm"), n_par, self.path).reshape(-1),
            }
        )

    def at(self, step: int, rank: int = 0) -> pd.DataFrame:
        """The per-module table of one step and rank (the last row of that step), read from that row
        alone: ``module, grad_norm`` and of ``param_norm, update_ratio, nonfinite`` those taken at
        that step (a number not taken has no column).

        Raises:
            InspectorError: the run has no such step for ``rank``.
        """
        table = self.table
        hits = np.flatnonzero(
            (table.column("step").to_numpy() == step) & (table.column("rank").to_numpy() == rank)
        )
        if not len(hits):
            raise InspectorError(f"{self.path} has no step {step} for rank {rank}")
        row = table.slice(int(hits[-1]), 1)
        frame = pd.DataFrame({"module": list(self.meta.modules)})
        for name, col in MODULE_COLUMNS.items():
            values = row.column(col)[0].as_py()
            if values is not None and len(values) != len(self.meta.modules):
                raise InspectorError(f"{self.path}: step {step} has {len(values)} per-module values, not "
                                     f"{len(self.meta.modules)}; the file is damaged")
            if values is not None or name == "grad_norm":
                frame[name] = np.asarray(values, dtype=np.float64) if values is not None else np.nan
        return frame


def _list_matrix(column: Any, width: int, name: str) -> np.ndarray:
    """A list column whose non-null lists all have ``width`` items, as a float32 (rows × width) array
    (NaN for null lists; zero-copy when none is null)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
    flat = arr.flatten().to_numpy(zero_copy_only=False).astype(np.float32, copy=False)
    if len(flat) != int(valid.sum()) * width:
        lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
        bad = int(np.flatnonzero(valid & (lengths != width))[0])
        raise InspectorError(
            f"{name}: row {bad} has {lengths[bad]} per-module values, not {width}; the file is damaged"
        )
    if valid.all() or width == 0:
        return flat.reshape(len(arr), width)
    out = np.full((len(arr), width), np.nan, dtype=np.float32)
    out[valid] = flat.reshape(-1, width)
    return out


def _list_positions(column: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """A list column's values flattened, the row of each value and its place in that row (no Python
    object per row: a long run's steps would each cost one)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    rows = np.repeat(np.arange(len(arr)), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    return pc.list_flatten(arr), rows, np.arange(len(rows)) - starts[rows]


def _steps_frame(table: Any, meta: RunMeta) -> pd.DataFrame:
    import pyarrow.compute as pc

    frame = table.select(STEP_COLUMNS).to_pandas()
    frame["loss_logged"] = pc.is_valid(table.column("loss")).to_numpy(
        zero_copy_only=False
    )  # a NaN loss is logged
    n = len(frame)
    lrs, rows, place = _list_positions(table.column("lr"))
    lr = lrs.to_numpy(zero_copy_only=False).astype(np.float64)
    for g in range(int(place.max()) + 1 if place.size else 0):
        col = np.full(n, np.nan)
        col[rows[place == g]] = lr[place == g]
        frame[f"lr_{g}"] = col
    names, rows, _ = _list_positions(table.column("scalar_names"))
    values, value_rows, _ = _list_positions(table.column("scalar_values"))
    if not np.array_equal(rows, value_rows):
        raise InspectorError("a step's scalar names and values differ in number; the file is damaged")
    names_np = np.asarray(names.to_pylist(), dtype=object)
    values_np = values.to_numpy(zero_copy_only=False).astype(np.float64)
    for name in pd.unique(names_np):  # in order of first appearance; a later value of a step wins
        if name in frame.columns:
            continue
        col = np.full(n, np.nan)
        hit = names_np == name
        col[rows[hit]] = values_np[hit]
        frame[name] = col
    return frame
