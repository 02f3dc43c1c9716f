"""Reading a run file's messages, checked (:mod:`.guard`), and following a growing one.

:func:`scan` reads the messages of a buffer: the schema (checked against the one the project writes,
its :class:`~.columns.RunMeta` within the limits), then each record batch, its header checked before
Arrow reads it and the batch validated in full before it is returned (a run of batches whose headers
are alike, as a healthy run's steps are, is read as one batch: :mod:`.alike`). :class:`RunTail` reads a file
(or an upload's bytes) with it in blocks of at most ``BLOCK`` bytes, from where it stopped last time,
and keeps the steps in a few large record batches (``CHUNK_ROWS`` rows each, and at most ``SMALL``
pieces of the rows read since), so
memory follows the numbers kept, not the number of steps: one batch per step as the watch writes costs
its numbers, not an Arrow object per step. The per-module NaN/Inf counts of healthy steps (all 0) are
kept once: every kept batch whose counts are all 0 holds a slice of one shared buffer of zeros.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.findings import InspectorError
from .alike import ALIKE_MIN, alike, read_alike
from .guard import (
    batch_header,
    batch_layout,
    check_meta,
    check_rows,
    check_schema,
    message_header,
    message_size,
    regular_fd,
    validate_batch,
)

META_KEY = b"inspector-watch"  # the schema metadata key of its RunMeta
BLOCK = 8 << 20  # bytes read at a time (a larger message is read whole, within the file's size)
CHUNK_ROWS = 8192  # rows of a kept batch once merged
SMALL = 16  # pieces of fewer rows kept at most (a followed run adds one per read)
PENDING = 512  # new batches merged into one kept batch at a time
ZERO_COLUMNS = ("module_nonfinite",)  # count columns whose all-zero values the kept batches share


@dataclass
class Scanned:
    """What :func:`scan` read: ``schema`` and ``meta`` (None when the schema message is not whole yet),
    the validated ``batches`` (zero-copy into the buffer, or one copy of a run of messages laid out
    alike: :mod:`.alike`), ``messages`` (the record batch messages they hold), ``end`` (bytes read: just
    past the last whole message), ``need`` (the size of the next message when it is not whole in the
    buffer, else 0), ``closed`` (the end-of-stream marker was read)."""

    schema: Any
    meta: Any
    batches: list[Any] = field(default_factory=list)
    end: int = 0
    need: int = 0
    closed: bool = False
    messages: int = 0


def scan(buf: Any, schema: Any = None, meta: Any = None, *, name: str = "run file",
         header_only: bool = False, limit: int = 1 << 62, origin: int = 0) -> Scanned:
    """The messages of ``buf`` (a ``pyarrow.Buffer`` at a message's start), checked: the schema first
    when ``schema`` is None, then at most ``limit`` record batch messages, up to the end of ``buf``, the
    end-of-stream marker, or a message not whole in ``buf`` (``need`` says how long it is).
    ``origin``: where ``buf`` starts in the file (for the messages).

    Raises:
        InspectorError: naming ``name`` and the fault: not a run file, a schema or metadata that is not
            the project's, a message of another kind, a batch that is damaged or over a limit.
    """
    import pyarrow as pa

    view = memoryview(buf)
    out = Scanned(schema, meta)
    try:
        if schema is None:
            got = message_at(view, 0, name)
            if got is None or got[0] + got[2] > len(view):
                out.need = 8 if got is None else got[0] + got[2]
                return out
            size, kind, body = got[:3]
            if kind != "schema" or body:
                raise InspectorError(f"{name} is not a run file: an Arrow stream starts with its schema, "
                                     f"not a {kind} message")
            out.schema = pa.ipc.read_schema(pa.ipc.read_message(pa.BufferReader(buf.slice(0, size))))
            raw = (out.schema.metadata or {}).get(META_KEY)
            if raw is None:
                raise InspectorError(f"{name} is an Arrow stream but not a run file (no "
                                     f"{META_KEY.decode()} metadata)")
            out.meta = check_meta(raw, name)
            check_schema(out.schema, out.meta.kind, name)
            out.end = size
        plain = 0  # up to here, messages are read one by one (a run that was not read at once)
        while not header_only and out.messages < limit:
            got = message_at(view, out.end, name)
            if got is None:
                out.need = 8 if len(view) > out.end else 0
                break
            size, kind, body, header, meta_bytes = got
            if size == 8 and kind == "end":
                out.closed = True
                break
            if out.end + size + body > len(view):
                out.need = size + body
                break
            if kind != "record batch" or header is None:
                raise InspectorError(f"{name}: a {kind} message after the schema; a run file holds only "
                                     "record batches: not read")
            rows = batch_header(meta_bytes, header, body, name)
            count = alike(view, out.end, size, body, limit - out.messages) if out.end >= plain else 1
            batch = None
            if count >= ALIKE_MIN:  # a run of steps laid out alike: read at once, one copy
                batch = read_alike(view, out.end, count, size, body, rows,
                                   *batch_layout(meta_bytes, header), out.schema)
                plain = out.end + count * (size + body) if batch is None else plain  # not tried twice
            if batch is None:  # one message, or a run not read at once: one by one (a fault is named here)
                count = 1
                batch = pa.ipc.read_record_batch(buf.slice(out.end, size + body), out.schema)
                validate_batch(batch, name)
            out.batches.append(batch)
            out.messages += count
            out.end += count * (size + body)
    except InspectorError:
        raise
    except (ValueError, TypeError, IndexError, OverflowError, struct.error, pa.ArrowException,
            OSError) as exc:
        raise InspectorError(f"{name}: a message at byte {origin + out.end:,} is damaged ({exc}): "
                             "not read") from None
    return out


def message_at(view: memoryview, at: int, name: str) -> tuple[int, str, int, Any, bytes] | None:
    """``(size of prefix and header, type, body length, header table, header bytes)`` of the message at
    ``at``; None when its prefix is not whole; the header is not parsed (type ``"?"``) when it is not
    whole."""
    got = message_size(view, at)
    if got is None:
        return None
    prefix, length = got
    if length == 0:
        return 8, "end", 0, None, b""
    if at + prefix + length > len(view):
        return prefix + length, "?", 0, None, b""
    meta = bytes(view[at + prefix:at + prefix + length])
    kind, body, header = message_header(meta)
    return prefix + length, kind, body, header, meta


class RunTail:
    """A run file read so far, from a path (it may grow; :meth:`poll` reads what was appended) or an
    upload's bytes (``data``): its ``schema``, ``meta``, the steps kept in a few large record batches
    (:meth:`batches`), ``offset`` (the bytes read), ``cut`` (a last message not whole: a writer mid-step
    or dead there), ``closed``, ``rows``, ``version`` (counts the polls that added rows) and
    ``generation`` (counts the times the file was replaced and read again from its start).

    ``keep=False`` keeps no steps: :meth:`poll` leaves the new ones in ``fresh`` (a tracker export).
    A file replaced under the same path (another inode, or shorter than what was read) is read again
    from its start. One tail may be shared between threads.
    """

    def __init__(self, path: str | os.PathLike | None = None, *, data: bytes | None = None,
                 name: str | None = None, keep: bool = True) -> None:
        if (path is None) == (data is None):
            raise TypeError("give a path or the data")
        self.path = None if path is None else str(path)
        self.name = name or (Path(self.path).name if self.path else "run file")
        self._data, self.keep = data, keep
        self._lock = threading.Lock()
        self.generation = -1
        self._reset()

    def _reset(self) -> None:
        self.generation += 1  # the file read from its start again
        self.schema: Any = None
        self.meta: Any = None
        self.offset, self.rows, self.version = 0, 0, 0
        self.cut = self.closed = False
        self._chunks: list[Any] = []  # sealed: CHUNK_ROWS rows or more each
        self._small: list[Any] = []  # the rows read since, in at most SMALL pieces
        self._zeros: Any = None  # the buffer of zeros that all-zero count columns share (_shared)
        self.fresh: list[Any] = []
        self._ident: tuple[int, int] | None = None

    def batches(self) -> list[Any]:
        """The kept steps as record batches in file order (a few, of up to ``CHUNK_ROWS`` rows)."""
        return [*self._chunks, *self._small]

    def poll(self) -> int:
        """Read what was appended since the last call; returns how many rows it added. With ``keep``
        they are in :meth:`batches`; without, the new ones (validated) are in ``fresh`` until the next
        call.

        Raises:
            InspectorError: the file is not a regular file, cannot be read, or is not a run file or is
                damaged (:func:`scan`), naming it.
        """
        with self._lock:
            self.fresh = []
            if self._data is not None:
                view = memoryview(self._data)
                return self._read(lambda at, n: view[at:at + n], len(self._data))
            fd = regular_fd(self.path)  # type: ignore[arg-type]
            try:
                st = os.fstat(fd)
                ident = (st.st_dev, st.st_ino)
                if self._ident is not None and (ident != self._ident or st.st_size < self.offset):
                    self._reset()  # a new file under this name: read it from its start
                self._ident = ident
                block = bytearray(min(BLOCK, st.st_size - self.offset)) if st.st_size > self.offset else b""

                def fill(at: int, n: int) -> memoryview:
                    nonlocal block
                    if n > len(block):  # a message longer than a block: read it whole
                        block = bytearray(n)
                    view = memoryview(block)[:n]
                    return view[:os.preadv(fd, [view], at)]

                return self._read(fill, st.st_size)
            except OSError as exc:
                raise InspectorError(f"run file {self.name} cannot be read ({exc.strerror or exc})") from None
            finally:
                os.close(fd)

    def _read(self, fill: Any, size: int) -> int:
        """Read from ``offset`` up to ``size`` with ``fill(at, n)`` (a view of the bytes there, reused:
        every batch kept is a copy made before the next fill)."""
        import pyarrow as pa

        rows = self.rows
        pending: list[Any] = []
        want = BLOCK
        self.cut = False
        while self.offset < size and not self.closed:
            asked = min(size - self.offset, want)
            buf = pa.py_buffer(fill(self.offset, asked))
            start = 0
            while True:
                s = scan(buf.slice(start), self.schema, self.meta, name=self.name, limit=PENDING,
                         origin=self.offset)
                self.schema, self.meta = s.schema, s.meta
                start += s.end
                self.offset += s.end
                self.closed = s.closed
                pending += s.batches
                if len(pending) >= PENDING or (pending and not s.batches):
                    self._take(pending)
                    pending = []
                if not s.batches or s.closed:
                    break
            self._take(pending)
            pending = []
            need = s.need
            # a pass that read nothing would read the same again: never loop on it
            short, stuck = len(buf) < asked, start == 0 and not self.closed
            del buf, s  # nothing read from this block is held past here: the next fill reuses it
            if stuck and short:  # the file shrank since its size was read: the next poll reads it again
                self.cut = True
                break
            if stuck and need <= asked:
                raise InspectorError(f"{self.name}: the message at byte {self.offset:,} does not read "
                                     f"although its {need:,} bytes are there: the file is damaged: not read")
            if self.closed or not need:
                continue
            if self.offset + need > size:  # the writer is mid-message, or died there
                self.cut = True
                break
            want = max(BLOCK, need)
        if self.rows > rows:
            pa.default_memory_pool().release_unused()  # the merged batches' copies
        return self.rows - rows

    def _take(self, batches: list[Any]) -> None:
        """Keep ``batches`` (one merged copy, so they no longer hold the block they were read from)."""
        if not batches:
            return
        merged = self._concat(batches)  # a copy: the block read is let go
        check_rows(merged, self.meta, self.name)
        self.rows += merged.num_rows
        if not self.keep:
            self.fresh.append(merged)
            return
        self._small.append(merged)
        if sum(b.num_rows for b in self._small) >= CHUNK_ROWS:  # a whole chunk: sealed, each row copied twice
            self._chunks.append(self._concat(self._small))
            self._small = []
        elif len(self._small) > SMALL:  # many small reads of a followed run: one piece again
            self._small = [self._concat(self._small)]
        self.version += 1

    def _concat(self, batches: list[Any]) -> Any:
        """``batches`` as one batch (a copy in the system pool: kept for long, freed pieces go back to the
        system, not a cache), each count column (``ZERO_COLUMNS``) whose numbers are all 0 (every healthy
        step's NaN/Inf counts) not copied but a slice of one buffer of zeros every kept batch shares."""
        import pyarrow as pa

        pool = pa.system_memory_pool()
        names = batches[0].schema.names
        zero = [n for n in ZERO_COLUMNS if n in names and all(_all_zero(b.column(n)) for b in batches)]
        merged = pa.concat_batches([b.drop_columns(zero) for b in batches], memory_pool=pool)
        for name in sorted(zero, key=names.index):  # in schema order: each goes back to its place
            lists = self._zero_lists([b.column(name) for b in batches])
            merged = merged.add_column(names.index(name), batches[0].schema.field(name), lists)
        return merged

    def _zero_lists(self, columns: list[Any]) -> Any:
        """The list columns ``columns`` (validated, every number 0) as one, its numbers a slice of the
        shared buffer of zeros (grown by doubling; older batches keep the one they hold)."""
        import pyarrow as pa

        valid = np.concatenate([c.is_valid().to_numpy(zero_copy_only=False) for c in columns])
        lengths = np.concatenate([np.diff(c.offsets.to_numpy()) for c in columns]).astype(np.int64)
        lengths[~valid] = 0  # a null list may span numbers: it holds none
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        kind = columns[0].type.value_type
        size = int(offsets[-1]) * kind.byte_width
        if self._zeros is None or self._zeros.size < size:
            self._zeros = pa.py_buffer(np.zeros(max(size, 2 * getattr(self._zeros, "size", 0)), np.uint8))
        numbers = pa.Array.from_buffers(kind, int(offsets[-1]), [None, self._zeros.slice(0, size)])
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), numbers, type=columns[0].type,
                                        mask=None if valid.all() else pa.array(~valid))


def _all_zero(column: Any) -> bool:
    """Whether every number in the lists of the validated ``column`` is 0 (none null)."""
    flat = column.flatten()
    return not flat.null_count and not flat.to_numpy(zero_copy_only=True).any()


def read_header(path: str | os.PathLike, name: str | None = None) -> Scanned:
    """The schema and :class:`~.columns.RunMeta` of the run file ``path`` (reads only its first message).

    Raises:
        InspectorError: not a regular file, not a run file, or its schema is not whole (naming it).
    """
    import pyarrow as pa

    name = name or Path(path).name
    fd = regular_fd(path)
    try:
        size, want = os.fstat(fd).st_size, 1 << 16
        while True:
            got = scan(pa.py_buffer(os.pread(fd, min(want, size), 0)), name=name, header_only=True)
            if got.schema is not None or got.need <= want or got.need > size:
                break
            want = got.need
    except OSError as exc:
        raise InspectorError(f"run file {name} cannot be read ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if got.schema is None:
        raise InspectorError(f"{name} does not start with a whole run file schema")
    return got


def read_all(path: str | os.PathLike | None = None, *, data: bytes | None = None,
             name: str | None = None) -> RunTail:
    """A :class:`RunTail` of the whole file (or ``data``), read once."""
    tail = RunTail(path, data=data, name=name)
    tail.poll()
    if tail.schema is None:
        raise InspectorError(f"{tail.name} is not a run file: it does not start with a whole Arrow "
                             "stream schema (it is empty, or not an Arrow stream)")
    return tail
