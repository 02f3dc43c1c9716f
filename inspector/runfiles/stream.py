"""The run file as an Arrow IPC stream: how it starts and ends, :func:`read_stream` (its messages from
a buffer, checked), and its writers (:class:`RunWriter` for the watch, :func:`append_check` for
``check_step``).

The stream is the schema (with :class:`~.columns.RunMeta` as JSON in its metadata under
:data:`META_KEY`), written when the file opens, record batches of one or more steps (the watch holds
steps for at most half a second, :class:`RunWriter`), and, once the writer closes it, the end-of-stream
marker. Every reader of the file (``inspector.read_run``,
:func:`~.run.read_check_run`, the tracker exports and the pages following a growing run) reads it
through :func:`.tail.scan`, checked as :mod:`.guard` says, which stops at a batch cut short (a run
still being written, or one that died mid-write) and keeps every whole one.
"""

from __future__ import annotations

import os
import signal
import threading
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, BinaryIO

from ..utils.findings import InspectorError
from .columns import VERSION, RunMeta, StepRecord, file_schema, record_batch
from .guard import check_meta, check_rows, read_head
from .tail import META_KEY, read_header, scan

STREAM_MAGIC = b"\xff\xff\xff\xff"  # an Arrow IPC stream starts with a continuation marker
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # and a closed one ends with this


@dataclass(frozen=True, eq=False)
class RunStream:
    """What :func:`read_stream` read: the ``schema`` (``pyarrow.Schema``), the whole record ``batches``
    in file order, ``end`` (the bytes read: just past the last whole message), ``cut`` (what follows
    ``end`` is not a whole message: the writer is mid-batch or died there) and ``closed`` (the
    end-of-stream marker ends the data: the writer closed the file)."""

    schema: Any = field(repr=False)
    batches: list[Any] = field(repr=False)
    end: int
    cut: bool
    closed: bool

    @property
    def rows(self) -> int:
        return sum(b.num_rows for b in self.batches)

    @cached_property
    def meta(self) -> RunMeta | None:
        """The :class:`~.columns.RunMeta` in the schema's metadata; None when it has none.

        Raises:
            ValueError: the metadata is not a run file's, or of a newer version
                (:meth:`RunMeta.from_json <.columns.RunMeta.from_json>`).
        """
        raw = (self.schema.metadata or {}).get(META_KEY)
        return None if raw is None else RunMeta.from_json(raw)


def read_stream(source: Any, schema: Any = None, *, header_only: bool = False,
                name: str = "run file") -> RunStream:
    """Read an Arrow run file's messages from ``source`` (a ``pyarrow.NativeFile`` at the stream's
    start, zero-copy from a buffer or a memory map, or bytes): its schema, then every whole record batch,
    stopping at the end of the data, the end-of-stream marker, or a batch cut short (``cut``), which is
    not an error. Everything is checked as :func:`.tail.scan` checks it (the schema the project writes,
    each batch's header, then the batch validated in full and its rows, :mod:`.guard`).

    ``schema``: the stream's schema when ``source`` starts after it (a growing file read on from an
    offset); ``header_only``: stop after the schema (its metadata tells what the file is).

    Raises:
        pyarrow.ArrowInvalid: ``schema`` is None and ``source`` does not start with a whole schema
            message (empty, or a header not written yet).
        InspectorError: naming ``name``: not a run file, or a damaged one, or one over a limit.
    """
    import pyarrow as pa

    buf = source.read_buffer() if isinstance(source, pa.NativeFile) else pa.py_buffer(source)
    meta = None if schema is None else check_meta((schema.metadata or {}).get(META_KEY, b"{}"), name)
    got = scan(buf, schema, meta, name=name, header_only=header_only)
    if got.schema is None:
        raise pa.ArrowInvalid("no Arrow stream schema: the data is empty or its schema is not whole yet")
    for batch in got.batches:
        check_rows(batch, got.meta, name)
    return RunStream(got.schema, got.batches, got.end, got.need > 0, got.closed)


class RunWriter:
    """Appends steps to a run file.

    Use as a context manager, or call :meth:`close`. The file is created (its folder too) and its
    schema written at once, so a run is a run file of 0 steps from its first byte; an existing file of
    that name is unlinked first, never truncated in place.

    ``hold``: seconds a step may wait in memory before it is on disk (0, the default: each :meth:`write`
    is one record batch, flushed at once). Above 0, the steps written meanwhile go out as one record batch
    when ``hold_steps`` of them wait, when the oldest has waited ``hold`` seconds (a thread of the
    writer's own sees to that while the program does something else: a reader following the file lags by
    at most ``hold``), at a ``write(..., now=True)``, at :meth:`flush` and at :meth:`close`. One batch of
    many steps costs about what one step's batch costs (the columns are built once), which is what the
    watch's fixed per-step cost on a small model was made of. A process killed without a chance to close
    (SIGKILL, ``os._exit``) loses the steps still held.
    """

    def __init__(self, path: str | os.PathLike, meta: RunMeta, *, hold: float = 0.0,
                 hold_steps: int = 64) -> None:

        self.path = Path(path)
        self.meta = meta
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.unlink(missing_ok=True)  # a new file: a reader's memory map of an old run stays valid
            self._file: BinaryIO = open(self.path, "wb")  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise InspectorError(f"cannot write the run file {self.path} ({exc.strerror or exc}); "
                                 "give a file path in a writable folder") from None
        sch = file_schema(meta.kind).with_metadata({META_KEY: meta.to_json().encode()})
        self._write(sch.serialize())  # the schema at once: a run is a run file from its first byte
        self.steps_written = 0
        self.hold, self.hold_steps = hold, max(1, hold_steps)
        self._held: list[StepRecord] = []  # the rows of the steps not written yet
        self._steps_held = 0
        self._lock = threading.RLock()  # the program's thread and the writer's own
        self._due = threading.Event()  # steps are held: the writer's thread counts down ``hold``
        self._closing = threading.Event()
        self._thread: threading.Thread | None = None
        if hold > 0:
            self._thread = threading.Thread(target=self._follow, name=f"run writer {self.path.name}",
                                             daemon=True)
            self._thread.start()

    def _write(self, message: Any) -> None:
        self._file.write(message)
        self._file.flush()
        self.bytes_written = self._file.tell()

    def write(self, records: list[StepRecord], now: bool = False) -> None:
        """Append one step's records (one per rank); written at once when the writer holds nothing back
        (``hold`` 0) or ``now`` (a finding, a stop, a failure: what a reader must see), else held as the
        class says."""
        if not records:
            return
        if self.hold <= 0:
            self._write(record_batch(records, self.meta.kind).serialize())
            self.steps_written += 1
            return
        with self._lock:
            self._held += records
            self._steps_held += 1
            if now or self._steps_held >= self.hold_steps:
                self._flush()
            elif self._steps_held == 1:
                self._due.set()

    def flush(self) -> None:
        """Write the steps held back, as one record batch, now."""
        with self._lock:
            self._flush()

    def _flush(self) -> None:
        if not self._held or self._file.closed:
            return
        # on the program's thread, SIGTERM / SIGINT wait until the batch is whole on disk: their handlers
        # write a row of their own (run-failed), never into the middle of this one
        mask = getattr(signal, "pthread_sigmask", None) if threading.current_thread() is \
            threading.main_thread() else None
        blocked = mask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT}) if mask else None
        try:
            message = record_batch(self._held, self.meta.kind).serialize()
            self._write(message)
            self.steps_written += self._steps_held
            self._held, self._steps_held = [], 0
            self._due.clear()
        finally:
            if mask is not None:
                mask(signal.SIG_SETMASK, blocked)

    def _follow(self) -> None:
        """The writer's thread: ``hold`` seconds after a step is held, what is held is written."""
        while not self._closing.is_set():  # a flush of its own may clear close()'s wake-up: checked here
            self._due.wait()
            if self._closing.wait(self.hold):
                return
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - the program's next write or close meets the same error
                return

    def close(self) -> None:
        """Write what is held, the end-of-stream marker, and close the file (safe to call twice)."""
        if self._file.closed:
            return
        if self._thread is not None:
            self._closing.set()
            self._due.set()
            self._thread.join()
        with self._lock:
            try:
                self._flush()
                self._write(END_OF_STREAM)
            finally:
                self._file.close()

    def __enter__(self) -> RunWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def append_check(path: str | os.PathLike, record: dict[str, Any],
                 ranks: list[list[int]] | None = None) -> None:
    """Append one ``check_step`` record (:meth:`~inspector.runfiles.CheckRecord.to_json`) to the run file
    ``path`` as one row (rank -1: the whole world), flushed at once; the first call makes the file.
    ``ranks``: the ranks each of the record's findings is about, in its order (``[]`` for the whole
    world), kept in the ``finding_ranks`` column.

    The stream is left open (no end marker), so the next call, in this process or a later one, appends
    to it, as lines were appended to the JSON-lines files of older versions.

    Raises:
        InspectorError: ``path`` exists but is not a ``check_step`` run file of this format (a watch
            run file, a JSON-lines file of an older version, anything else): give another path.
    """
    totals = record.get("global") or {}
    row = StepRecord(step=int(record["step"]), rank=-1, time=float(record.get("time") or 0.0),
                     grad_norm=totals.get("grad_norm"), nonfinite=int(totals.get("nonfinite") or 0),
                     findings=list(record.get("findings") or []),
                     check={k: v for k, v in record.items() if k not in ("format", "findings")},
                     finding_ranks=ranks)
    p = Path(path)
    if p.is_file() and p.stat().st_size:
        _check_file(p)
        try:
            with open(p, "ab") as fh:
                fh.write(record_batch([row], "check").serialize())
        except OSError as exc:
            raise InspectorError(f"cannot append to the run file {p} ({exc.strerror or exc})") from None
        return
    meta = RunMeta(model=str(record.get("note") or ""), world_size=int(record["world_size"]), every=1,
                   modules=(), parameters=(), parameter_modules=(), checks=("distributed",),
                   started=float(record.get("time") or 0.0), note=str(record.get("note") or ""), kind="check")
    writer = RunWriter(p, meta)  # the schema, then the first row; never closed: later calls append
    try:
        writer.write([row])
    finally:
        writer._file.close()


def _check_file(p: Path) -> None:
    """Raise unless ``p`` is a check_step run file this version appends to."""
    meta, names = None, []
    if read_head(p, 4) == STREAM_MAGIC:
        try:
            header = read_header(p)
            meta, names = header.meta, header.schema.names
        except InspectorError:
            meta = None
    # a file written before the finding_ranks column: a row of this schema cannot follow its rows
    if meta is None or meta.kind != "check" or meta.version != VERSION or "finding_ranks" not in names:
        raise InspectorError(
            f"{p} exists and is not a check_step run file of this version; give check_step another path "
            "(or remove the file)")
