"""Reading a run file back: :func:`read_run` gives a frozen :class:`~.tables.Run` of tables, of either kind
of run file (the watch's, ``check_step``'s); :func:`parse_run_bytes` the same from bytes; :func:`run_of`
what a :class:`~.tail.RunTail` has read so far."""

from __future__ import annotations

import os
from pathlib import Path

from ..utils.findings import InspectorError
from .checked import check_as_run
from .frames import run_table, steps_frame
from .guard import read_head, regular_fd_close
from .run import check_run_of, is_run_file, parse_run, read_check_run
from .stream import STREAM_MAGIC, RunStream
from .tables import Run, _findings
from .tail import RunTail, read_all


def run_of(tail: RunTail, source: str = "") -> Run:
    """The :class:`Run` of what ``tail`` has read so far (a run of 0 steps when only its header is). A
    run that ended by an exception is not complete; the rows that carry its ``run-failed`` findings
    (written after the last step, one per rank that failed) are no steps.

    Raises:
        InspectorError: a ``check_step`` record is damaged, or the steps table would be larger than the
            file's size allows (naming the file).
    """
    meta = tail.meta
    if meta.kind == "check" and tail.rows:  # check_step's records, from the batches already read
        return check_as_run(check_run_of(RunStream(tail.schema, tail.batches(), tail.offset, tail.cut,
                                                   tail.closed), tail.name))
    table = run_table(tail)
    findings = _findings(table)
    failed = any(f.code == "run-failed" for f in findings)
    while failed and table.num_rows and table.column("step_time")[table.num_rows - 1].as_py() is None:
        table = table.slice(0, table.num_rows - 1)  # one such row per rank that failed
    frame = steps_frame(table, tail.offset, tail.name)
    return Run(tail.name, meta, frame, findings, tail.closed and not failed, table, source)


def parse_run_bytes(data: bytes, name: str = "run file") -> Run:
    """Like :func:`read_run`, from the file's bytes (an upload)."""
    if not data.strip():
        raise InspectorError(f"{name} is empty{' (blank lines only)' if data else ''}: upload the run file "
                             "that watch(...) or check_step wrote")
    if data[:4] == STREAM_MAGIC:
        return run_of(read_all(data=data, name=name))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InspectorError(f"{name} is neither a watch run file nor a check_step run.jsonl") from None
    return check_as_run(parse_run(text, name))


def is_watch_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a regular file that starts like a watch run file (an Arrow IPC stream; reads
    4 bytes; a FIFO or device is not opened)."""
    return read_head(path, 4) == STREAM_MAGIC


def read_run(path: str | os.PathLike) -> Run:
    """Read a run file written by :func:`inspector.watch` or by ``check_step`` (the same Arrow file; the
    JSON lines ``check_step`` wrote in older versions read too): the one reader of every run file, also
    ``inspector.read_run`` and ``inspector.distributed.read_run``. A ``check_step`` file gives a
    :class:`Run` of kind ``"check"``, with its per-rank and per-tensor records (see :class:`Run`).

    The file may still be growing: every complete step written so far is read (a file holding only its
    header is a run of 0 steps). Only a regular file is read, and everything in it is checked first
    (:mod:`inspector.runfiles.guard`: the limits there).

    Raises:
        InspectorError: the file is missing, not a regular file, neither kind of run file, damaged or
            over a limit (the message names it and says which).
    """
    p = Path(path)
    if not p.exists():
        raise InspectorError(f"run file {p} does not exist; write it with inspector.watch(model, optimizer, "
                             f"{str(p)!r}) or `python -m inspector watch FILE.py:factory -o {p}`")
    if is_watch_file(p):
        return run_of(read_all(p), source=str(p))
    regular_fd_close(p)  # a FIFO or device: refused before it is opened
    if not is_run_file(p):
        raise InspectorError(
            f"{p.name} is neither a watch run file (Arrow stream) nor a check_step run.jsonl"
        )
    return check_as_run(read_check_run(p))
