"""Reading a run file back: :func:`read_run` gives a frozen :class:`Run` of tables."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..capture import Captures
from ..utils.findings import Finding, InspectorError
from .record import META_KEY, OPTIONAL, STREAM_MAGIC, RunMeta, StepRecord, record_batch, schema

END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
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


@dataclass(frozen=True, eq=False)
class Run:
    """A watched training run, as tables (see :func:`read_run`).

    ``steps``: one row per (step, rank): ``STEP_COLUMNS``, ``loss_logged`` (a NaN ``loss`` was logged
    as NaN where it is true), then ``lr_0, lr_1, ...`` (one per
    param group) and one column per scalar logged with ``w.log``. ``modules`` (built on first
    use): one row per (step, rank, module) with ``grad_norm, param_norm, update_ratio,
    nonfinite``; :meth:`matrix` gives one of them as a steps × modules array without building
    it. ``complete`` is False while the file is still being written or when the writer died
    (every complete step is read either way). ``check_run``: for a ``check_step`` ``run.jsonl``,
    its :class:`~inspector.distributed.DistributedRun` (per-rank detail), else None.
    """

    path: str
    meta: RunMeta
    steps: pd.DataFrame = field(repr=False)
    findings: list[StepFinding]
    complete: bool
    table: Any = field(repr=False)  # the pyarrow.Table of the rows
    source: str = ""  # the file's full path ("" for an upload)
    check_run: Any = field(
        default=None, repr=False
    )  # a check_step file's DistributedRun (None for a watch file)

    @cached_property
    def captures(self) -> Captures | None:
        """The inputs and outputs of the first ``nonfinite-forward`` producer, stored next to the
        run file (:func:`~inspector.watching.captured.read_captures`); None when there are none."""
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


def _read_stream(source: Any, name: str) -> tuple[RunMeta, Any, bool]:
    import pyarrow as pa

    try:
        reader = pa.ipc.open_stream(source)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InspectorError(f"{name} is not a readable watch run file ({exc}); write one with "
                             "inspector.watch or `python -m inspector watch`") from None
    raw = (reader.schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise InspectorError(
            f"{name} is an Arrow stream but not a watch run file (no {META_KEY.decode()} metadata)"
        )
    try:
        meta = RunMeta.from_json(raw)
    except (ValueError, TypeError, OverflowError) as exc:
        raise InspectorError(f"{name}: {exc}") from None
    except RecursionError:
        raise InspectorError(f"{name}: its run metadata is nested too deeply to be a watch run's; "
                             "write the file again with inspector.watch") from None
    missing = [f.name for f in schema() if f.name not in reader.schema.names and f.name not in OPTIONAL]
    if missing:
        raise InspectorError(
            f"{name} lacks the columns {', '.join(missing)}; it was not written by inspector.watch"
        )
    batches, complete = [], False
    while True:
        try:
            batches.append(reader.read_next_batch())
        except StopIteration:  # the end-of-stream marker, or the end of what is written so far
            complete = source.size() >= 8 and bytes(source.read_at(8, source.size() - 8)) == END_OF_STREAM
            break
        except (pa.ArrowInvalid, OSError, EOFError):  # the writer is mid-batch or died there
            break
    table = pa.Table.from_batches(batches, schema=reader.schema)
    for column in OPTIONAL:  # a column of a later version: null in an older file
        if column not in table.column_names:
            field_ = schema().field(column)
            table = table.append_column(field_, pa.nulls(table.num_rows, field_.type))
    return meta, table.select(schema().names), complete


def _steps_frame(table: Any, meta: RunMeta) -> pd.DataFrame:
    import pyarrow.compute as pc

    frame = table.select(STEP_COLUMNS).to_pandas()
    frame["loss_logged"] = pc.is_valid(table.column("loss")).to_numpy(
        zero_copy_only=False
    )  # a NaN loss is logged
    lrs = table.column("lr").to_pylist()
    for g in range(max((len(v) for v in lrs if v), default=0)):
        frame[f"lr_{g}"] = [v[g] if v and g < len(v) else np.nan for v in lrs]
    names, values = table.column("scalar_names").to_pylist(), table.column("scalar_values").to_pylist()
    logged: dict[str, list[float]] = {}
    for i, (ns, vs) in enumerate(zip(names, values, strict=True)):
        for n, v in zip(ns or [], vs or [], strict=True):
            logged.setdefault(n, [np.nan] * len(frame))[i] = v
    for n, col in logged.items():
        if n not in frame.columns:
            frame[n] = col
    return frame


def _findings(table: Any) -> list[StepFinding]:
    out = []
    for step, rank, fs in zip(table.column("step").to_pylist(), table.column("rank").to_pylist(),
                              table.column("findings").to_pylist(), strict=True):
        for f in fs or []:
            out.append(StepFinding(step, None if rank < 0 else rank, f["code"], f["severity"], f["where"],
                                   f["message"]))
    return out


def _from_table(name: str, meta: RunMeta, table: Any, complete: bool, source: str = "") -> Run:
    return Run(name, meta, _steps_frame(table, meta), _findings(table), complete, table, source)


def parse_run_bytes(data: bytes, name: str = "run file") -> Run:
    """Like :func:`read_run`, from the file's bytes (an upload)."""
    import pyarrow as pa

    from ..runfiles import parse_check_stream, parse_run

    if data[:4] == STREAM_MAGIC:
        meta, table, complete = _read_stream(pa.BufferReader(data), name)
        if meta.kind == "check":
            return _from_distributed(parse_check_stream(data, name))
        return _from_table(name, meta, table, complete)

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InspectorError(f"{name} is neither a watch run file nor a check_step run.jsonl") from None
    return _from_distributed(parse_run(text, name))


def is_watch_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` starts like a watch run file (an Arrow IPC stream; reads 4 bytes)."""
    from ..loading.checkpoint_guards import file_head

    return file_head(path, 4) == STREAM_MAGIC


def read_run(path: str | os.PathLike) -> Run:
    """Read a run file written by :func:`inspector.watch` or by ``check_step`` (the same Arrow file; the
    JSON lines ``check_step`` wrote in older versions read too).

    The file may still be growing: every complete step written so far is read.

    Raises:
        InspectorError: the file is missing or is neither kind of run file (the message says which).
    """
    import pyarrow as pa

    p = Path(path)
    if not p.is_file():
        raise InspectorError(f"run file {p} does not exist; write it with inspector.watch(model, optimizer, "
                             f"{str(p)!r}) or `python -m inspector watch FILE.py:factory -o {p}`")
    from ..runfiles import is_run_file, read_check_run

    if is_watch_file(p):
        with pa.memory_map(str(p), "r") as source:  # zero-copy: 10,000 × 1,000 steps read in well under 1 s
            meta, table, complete = _read_stream(source, p.name)
            if meta.kind != "check":
                return _from_table(p.name, meta, table, complete, source=str(p))
        return _from_distributed(read_check_run(p))  # check_step's records, from the same file

    if not is_run_file(p):
        raise InspectorError(
            f"{p.name} is neither a watch run file (Arrow stream) nor a check_step run.jsonl"
        )
    return _from_distributed(read_check_run(p))


def _from_distributed(dr: Any) -> Run:
    """A ``check_step`` run as a :class:`Run`: its parameters grouped into their modules, each
    module's gradient norm the global one (as a watch file stores it), the file's notes
    (``run-file-truncated``, ``run-file-newer``) among the findings and the run kept as ``check_run``."""
    first = dr.records[0]
    params = [t["name"] for t in first["tensors"] if t.get("kind") == "parameter"]
    modules: list[str] = []
    owner = []
    for p in params:
        mod = p.rpartition(".")[0]
        if mod not in modules:
            modules.append(mod)
        owner.append(modules.index(mod))
    meta = RunMeta(model=dr.path, world_size=dr.world_size, every=1, modules=tuple(modules),
                   parameters=tuple(params), parameter_modules=tuple(owner), checks=("distributed",))
    owners = np.asarray(owner, dtype=np.int64)
    records = []
    for rec in dr.records:
        by_name = {t["name"]: t for t in rec["tensors"]}
        norms = np.array([_global_norm(by_name.get(p)) for p in params], dtype=np.float64)
        mod_sq = np.zeros(len(modules))
        np.add.at(mod_sq, owners, np.nan_to_num(norms, nan=0.0) ** 2)
        for r in rec["ranks"]:
            rank = r["rank"]
            nonfinite = np.zeros(len(modules), dtype=np.int32)
            for i, p in enumerate(params):
                nonfinite[owner[i]] += sum(_at_rank(by_name.get(p), k, rank) for k in ("nan", "inf"))
            records.append(StepRecord(
                step=rec["step"], rank=rank, time=float(rec.get("time") or 0.0), grad_norm=r.get("grad_norm"),
                nonfinite=int(r.get("nonfinite") or 0), device_allocated=r.get("device_allocated"),
                device_peak=r.get("device_peak"), rss=r.get("rss"), module_grad_norm=np.sqrt(mod_sq),
                module_nonfinite=nonfinite, param_grad_norm=norms))
    import pyarrow as pa

    table = (pa.Table.from_batches([record_batch(records, "check")]) if records
             else schema().empty_table())
    findings = [StepFinding(step, None, f.code, f.severity, f.where, f.message) for step, f in dr.findings]
    complete = not any(f.code == "run-file-truncated" for f in findings)
    return Run(dr.path, meta, _steps_frame(table, meta), findings, complete, table, check_run=dr)


def _global_norm(tensor: dict[str, Any] | None) -> float:
    """A tensor's global gradient norm (NaN when not recorded)."""
    value = (tensor or {}).get("grad_norm")
    return np.nan if value is None else float(value)


def _at_rank(tensor: dict[str, Any] | None, key: str, rank: int) -> int:
    """``tensor[key][rank]``, 0 where the list is absent or shorter."""
    values = (tensor or {}).get(key) or []
    return int(values[rank] or 0) if rank < len(values) else 0
