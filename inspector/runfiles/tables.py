"""A run file as tables: :class:`Run` (what :func:`~.reading.read_run` gives) and :class:`StepFinding`."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from ..capture import Captures
from ..utils.codes import origin_first
from ..utils.findings import Finding, InspectorError
from ..utils.labels import module_label
from .columns import RunMeta
from .frames import STEP_COLUMNS, finding_rows, steps_frame  # noqa: F401 - re-exported
from .run import DistributedRun

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

    def step_numbers(self, rank: int = 0) -> np.ndarray:
        """The step numbers of ``rank``'s rows in file order (the rows of :meth:`matrix`)."""
        steps = self.table.column("step").to_numpy()
        ranks = self.table.column("rank").to_numpy()
        return steps if (ranks == rank).all() else steps[ranks == rank]

    def matrix(self, column: str = "grad_norm", rank: int = 0, *, start: int = 0,
               stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(steps, values)``: the step numbers of ``rank`` and a float32 array of shape
        ``(len(steps), len(module_order))`` of the per-module ``column`` (NaN where not taken).
        ``start``, ``stop``: only those rows of ``rank`` (as in ``step_numbers(rank)[start:stop]``), so a
        long run can be read a block of steps at a time.

        Raises:
            InspectorError: ``column`` is not one of ``grad_norm, param_norm, update_ratio, nonfinite``.
        """
        if column not in MODULE_COLUMNS:
            raise InspectorError(f"module column {column!r} is not one of {', '.join(MODULE_COLUMNS)}")
        ranks = self.table.column("rank").to_numpy()
        sub = self.table.select(["step", MODULE_COLUMNS[column]])  # only what is read: no copy of the rest
        if (ranks == rank).all():
            lo, hi, _ = slice(start, stop).indices(len(ranks))
            sub = sub.slice(lo, max(0, hi - lo))
        else:
            sub = sub.take(np.flatnonzero(ranks == rank)[start:stop])
        values = _list_matrix(sub.column(1), len(self.meta.modules), self.path)
        return sub.column(0).to_numpy(), values

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
    (NaN for null lists), filled chunk by chunk from views of the column (no combined copy)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    out = np.empty((sum(len(c) for c in chunks), width), dtype=np.float32)
    row = 0
    for arr in chunks:
        valid = ~np.asarray(arr.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        flat = arr.flatten().to_numpy(zero_copy_only=False)
        if len(flat) != int(valid.sum()) * width:
            lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
            bad = int(np.flatnonzero(valid & (lengths != width))[0])
            raise InspectorError(f"{name}: row {row + bad} has {lengths[bad]} per-module values, not "
                                 f"{width}; the file is damaged")
        block = out[row:row + len(arr)]
        if width == 0:
            pass
        elif valid.all():
            block[...] = flat.reshape(len(arr), width)
        else:
            block[...] = np.nan
            block[valid] = flat.reshape(-1, width)
        row += len(arr)
    return out


_steps_frame = steps_frame  # check_as_run builds its steps table the same way


def _findings(table: Any) -> list[StepFinding]:
    """The file's findings in file order, but at each step the ranks where NaN/Inf began first (the
    recorder's order: :func:`~inspector.utils.codes.origin_first`)."""
    return origin_first(StepFinding(*row) for row in finding_rows(table))
