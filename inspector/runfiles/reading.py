"""Reading a run file back: :func:`read_run` gives a frozen :class:`~.tables.Run` of tables, of either kind
of run file (the watch's, ``check_step``'s); :func:`parse_run_bytes` the same from bytes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..utils.findings import InspectorError
from .checked import check_as_run
from .columns import OPTIONAL, RunMeta, schema
from .run import check_run_of, is_run_file, parse_run, read_check_run
from .stream import META_KEY, STREAM_MAGIC, RunStream, read_stream
from .tables import Run, StepFinding, _steps_frame


def _read_stream(source: Any, name: str) -> tuple[RunMeta, RunStream, Any]:
    """``(meta, stream, table)`` of a run file of either kind, read once
    (:func:`~inspector.runfiles.read_stream`): ``table`` holds its whole steps in the columns of
    :func:`~inspector.runfiles.schema`; ``stream.closed`` says whether the writer closed it."""
    import pyarrow as pa

    try:
        stream = read_stream(source)
    except (pa.ArrowInvalid, OSError) as exc:
        raise InspectorError(f"{name} is not a readable watch run file ({exc}); write one with "
                             "inspector.watch or `python -m inspector watch`") from None
    try:
        meta = stream.meta
    except (ValueError, TypeError, OverflowError) as exc:
        raise InspectorError(f"{name}: {exc}") from None
    except RecursionError:
        raise InspectorError(f"{name}: its run metadata is nested too deeply to be a watch run's; "
                             "write the file again with inspector.watch") from None
    if meta is None:
        raise InspectorError(
            f"{name} is an Arrow stream but not a watch run file (no {META_KEY.decode()} metadata)"
        )
    names = stream.schema.names
    missing = [f.name for f in schema() if f.name not in names and f.name not in OPTIONAL]
    if missing:
        raise InspectorError(
            f"{name} lacks the columns {', '.join(missing)}; it was not written by inspector.watch"
        )
    table = pa.Table.from_batches(stream.batches, schema=stream.schema)
    for column in OPTIONAL:  # a column of a later version: null in an older file
        if column not in table.column_names:
            field_ = schema().field(column)
            table = table.append_column(field_, pa.nulls(table.num_rows, field_.type))
    return meta, stream, table.select(schema().names)


def _findings(table: Any) -> list[StepFinding]:
    out = []
    for step, rank, fs in zip(table.column("step").to_pylist(), table.column("rank").to_pylist(),
                              table.column("findings").to_pylist(), strict=True):
        for f in fs or []:
            out.append(StepFinding(step, None if rank < 0 else rank, f["code"], f["severity"], f["where"],
                                   f["message"]))
    return out


def _from_table(name: str, meta: RunMeta, table: Any, complete: bool, source: str = "") -> Run:
    findings = _findings(table)
    failed = any(f.code == "run-failed" for f in findings)
    if failed and table.num_rows and table.column("step_time")[-1].as_py() is None:
        table = table.slice(0, table.num_rows - 1)  # the row that carries the failure is no step
    return Run(name, meta, _steps_frame(table, meta), findings, complete and not failed, table, source)


def parse_run_bytes(data: bytes, name: str = "run file") -> Run:
    """Like :func:`read_run`, from the file's bytes (an upload)."""
    import pyarrow as pa

    if data[:4] == STREAM_MAGIC:
        meta, stream, table = _read_stream(pa.BufferReader(data), name)
        if meta.kind == "check":
            return check_as_run(check_run_of(stream, name))
        return _from_table(name, meta, table, stream.closed)

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InspectorError(f"{name} is neither a watch run file nor a check_step run.jsonl") from None
    return check_as_run(parse_run(text, name))


def is_watch_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` starts like a watch run file (an Arrow IPC stream; reads 4 bytes)."""
    from ..loading.checkpoint_guards import file_head

    return file_head(path, 4) == STREAM_MAGIC


def read_run(path: str | os.PathLike) -> Run:
    """Read a run file written by :func:`inspector.watch` or by ``check_step`` (the same Arrow file; the
    JSON lines ``check_step`` wrote in older versions read too): the one reader of every run file, also
    ``inspector.read_run`` and ``inspector.distributed.read_run``. A ``check_step`` file gives a
    :class:`Run` of kind ``"check"``, with its per-rank and per-tensor records (see :class:`Run`).

    The file may still be growing: every complete step written so far is read.

    Raises:
        InspectorError: the file is missing or is neither kind of run file (the message says which).
    """
    import pyarrow as pa

    p = Path(path)
    if not p.is_file():
        raise InspectorError(f"run file {p} does not exist; write it with inspector.watch(model, optimizer, "
                             f"{str(p)!r}) or `python -m inspector watch FILE.py:factory -o {p}`")
    if is_watch_file(p):
        with pa.memory_map(str(p), "r") as source:  # zero-copy: 10,000 × 1,000 steps read in well under 1 s
            meta, stream, table = _read_stream(source, p.name)
            if meta.kind == "check":  # check_step's records, from the stream already read
                return check_as_run(check_run_of(stream, p.name))
            return _from_table(p.name, meta, table, stream.closed, source=str(p))

    if not is_run_file(p):
        raise InspectorError(
            f"{p.name} is neither a watch run file (Arrow stream) nor a check_step run.jsonl"
        )
    return check_as_run(read_check_run(p))
