"""What a run file may hold, checked before any of it is used: a run file comes from another machine (an
upload, a shared runs folder) and is read by a shared server, so it is untrusted input.

- :func:`regular_fd`: only a regular file is opened (a FIFO or a device is refused before ``open``, and
  again after it, on the descriptor, so a file swapped in between is refused too);
- :func:`message_size` and :func:`batch_header`: the IPC framing and the record batch header, read from
  the message's flatbuffer before Arrow reads the batch: no compressed buffer (ZSTD/LZ4 bodies, which
  the project never writes: a 37 KB list would decompress to gigabytes), rows and buffers within the
  message's own bytes;
- :func:`check_schema`: the exact columns and types the project writes (no dictionary, run-end or
  other encoding, no other type);
- :func:`validate_batch`: every batch validated in full (offsets, lengths, UTF-8) before any numpy
  view, and :func:`check_rows`: each row against the file's :class:`~.columns.RunMeta` (ranks,
  per-module list lengths, lrs and scalar names within the limits below).

The limits (a file over one is refused with a message naming the file and the limit):

========================  =========================================================================
``MAX_META_BYTES``        64 MiB of schema metadata (the run's :class:`~.columns.RunMeta` as JSON)
``MAX_MODULES``           1,000,000 modules (``RunMeta.modules``)
``MAX_PARAMETERS``        4,000,000 parameters (``RunMeta.parameters``)
``MAX_WORLD``             1,048,576 ranks (``RunMeta.world_size``)
``MAX_BATCH_ROWS``        rows of one batch: at most ``MAX_WORLD`` and 1 per 8 bytes of its body
``MAX_LRS``               100,000 learning rates (param groups) in one row
``MAX_SCALARS``           100,000 logged scalar names in one row, and over the whole run
``MAX_CELLS``             the steps table (rows × (lrs + scalar names)) at most
                          ``CELLS_FLOOR`` (8,000,000) + 1 cell per 2 bytes of the file
========================  =========================================================================
"""

from __future__ import annotations

import os
import stat
import struct
from pathlib import Path
from typing import Any

import numpy as np

from ..utils.findings import InspectorError

MAX_META_BYTES = 64 << 20
MAX_MODULES = 1_000_000
MAX_PARAMETERS = 4_000_000
MAX_WORLD = 1 << 20
MAX_LRS = 100_000
MAX_SCALARS = 100_000
CELLS_FLOOR = 8_000_000


def max_cells(file_size: int) -> int:
    """How many cells the steps table of a file of ``file_size`` bytes may have (``MAX_CELLS``)."""
    return CELLS_FLOOR + file_size // 2


def regular_fd(path: str | os.PathLike) -> int:
    """A read-only descriptor of ``path``, when it is a regular file (the caller closes it).

    Raises:
        InspectorError: ``path`` is missing, unreadable, or not a regular file (a FIFO, a device, a
            folder), checked before it is opened and again on the open descriptor.
    """
    p = Path(path)
    try:
        before = os.stat(p)
    except OSError as exc:
        raise InspectorError(f"run file {p} cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(before.st_mode):
        raise InspectorError(f"{p.name} is not a regular file ({_kind(before.st_mode)}); a run file is "
                             "a regular file written by inspector.watch or check_step")
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InspectorError(f"run file {p} cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InspectorError(f"{p.name} stopped being a regular file while it was opened; not read")
    return fd


def regular_fd_close(path: str | os.PathLike) -> None:
    """Raise :class:`InspectorError` unless ``path`` is a regular file that opens (then closes it)."""
    os.close(regular_fd(path))


def _kind(mode: int) -> str:
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a plain file"


def read_head(path: str | os.PathLike, size: int) -> bytes:
    """The first ``size`` bytes of the regular file ``path`` (``b""`` when it is not one or is unreadable)."""
    try:
        fd = regular_fd(path)
    except InspectorError:
        return b""
    try:
        return os.pread(fd, size, 0)
    except OSError:
        return b""
    finally:
        os.close(fd)


# The Arrow IPC framing: 0xFFFFFFFF, the int32 length of the flatbuffer ``Message``, the message, its body.
_CONTINUATION = 0xFFFFFFFF


def message_size(head: bytes | memoryview, at: int = 0) -> tuple[int, int] | None:
    """``(prefix, metadata length)`` of the message at ``at`` of ``head``; None when fewer than its 8
    prefix bytes are there. The end-of-stream marker reads as ``(8, 0)``.

    Raises:
        ValueError: the prefix is not an Arrow message's, or its metadata is over ``MAX_META_BYTES``.
    """
    if len(head) - at < 8:
        return None
    marker, length = struct.unpack_from("<Ii", head, at)
    if marker != _CONTINUATION:
        raise ValueError("the bytes there are not an Arrow IPC message (no continuation marker)")
    if length < 0 or length > MAX_META_BYTES:
        raise ValueError(f"a message header of {length:,} bytes (at most {MAX_META_BYTES:,})")
    return 8, length


class _Table:
    """A table of a flatbuffer, every offset checked against the buffer's bounds."""

    def __init__(self, buf: bytes | memoryview, pos: int) -> None:
        self.buf, self.pos = buf, pos
        _need(buf, pos, 4)
        vt = pos - struct.unpack_from("<i", buf, pos)[0]
        _need(buf, vt, 4)
        self.vt, (self.vt_size, _) = vt, struct.unpack_from("<HH", buf, vt)
        _need(buf, vt, self.vt_size)

    def _field(self, index: int) -> int:
        at = 4 + 2 * index
        if at + 2 > self.vt_size:
            return 0
        off = struct.unpack_from("<H", self.buf, self.vt + at)[0]
        return self.pos + off if off else 0

    def scalar(self, index: int, fmt: str, default: int = 0) -> int:
        at = self._field(index)
        if not at:
            return default
        _need(self.buf, at, struct.calcsize(fmt))
        return int(struct.unpack_from("<" + fmt, self.buf, at)[0])

    def present(self, index: int) -> bool:
        return bool(self._field(index))

    def table(self, index: int) -> _Table | None:
        at = self._field(index)
        if not at:
            return None
        _need(self.buf, at, 4)
        return _Table(self.buf, at + struct.unpack_from("<I", self.buf, at)[0])

    def structs(self, index: int, fmt: str) -> np.ndarray:
        """A vector of structs of int64 fields (``fmt`` ``"qq"``) as an (n, 2) int64 array."""
        at = self._field(index)
        if not at:
            return np.zeros((0, len(fmt)), np.int64)
        _need(self.buf, at, 4)
        vec = at + struct.unpack_from("<I", self.buf, at)[0]
        _need(self.buf, vec, 4)
        n = struct.unpack_from("<I", self.buf, vec)[0]
        _need(self.buf, vec + 4, n * 8 * len(fmt))
        return np.frombuffer(self.buf, dtype="<i8", count=n * len(fmt), offset=vec + 4).reshape(n, len(fmt))


def _need(buf: bytes | memoryview, at: int, size: int) -> None:
    if at < 0 or size < 0 or at + size > len(buf):
        raise ValueError("a message header points outside itself")


_MESSAGE_TYPES = {1: "schema", 2: "dictionary batch", 3: "record batch", 4: "tensor", 5: "sparse tensor"}


def message_header(meta: bytes | memoryview) -> tuple[str, int, _Table | None]:
    """``(type, body length, header table)`` of a message's flatbuffer ``meta``.

    Raises:
        ValueError: ``meta`` is not a valid ``Message`` (an offset outside it, an unknown type, a
            negative body length).
    """
    _need(meta, 0, 4)
    message = _Table(meta, struct.unpack_from("<I", meta, 0)[0])
    kind = _MESSAGE_TYPES.get(message.scalar(1, "B"), "unknown")
    body = message.scalar(3, "q")
    if body < 0:
        raise ValueError(f"a message body of {body} bytes")
    return kind, body, message.table(2)


def batch_header(header: _Table, body: int, name: str) -> int:
    """The rows a record batch header declares, once it is checked against its ``body`` bytes: no
    compressed body, every buffer inside the body, at most ``MAX_BATCH_ROWS`` rows (1 per 8 bytes:
    the int64 ``step`` column) and no column longer than the body's bits.

    Raises:
        InspectorError: naming ``name`` and the fault.
    """
    rows = header.scalar(0, "q")
    if header.present(3):
        raise InspectorError(f"{name}: a record batch with compressed buffers (LZ4/ZSTD); a run file is "
                             "never compressed: not read")
    if rows < 0 or rows > min(MAX_WORLD, body // 8):
        raise InspectorError(f"{name}: a record batch declares {rows:,} rows in {body:,} bytes; at most "
                             f"{min(MAX_WORLD, body // 8):,} fit: the file is damaged or forged")
    nodes, buffers = header.structs(1, "qq"), header.structs(2, "qq")
    if len(nodes) and (nodes.min() < 0 or nodes[:, 0].max() > 8 * body + 8):
        raise InspectorError(f"{name}: a column declares more values than its {body:,} bytes hold")
    if len(buffers) and (buffers.min() < 0 or (buffers[:, 0] + buffers[:, 1]).max() > body):
        raise InspectorError(f"{name}: a buffer lies outside its record batch's {body:,} bytes")
    return rows


def check_schema(schema: Any, kind: str, name: str) -> None:
    """Raise :class:`InspectorError` unless ``schema`` has exactly the columns and types the project
    writes for a file of ``kind`` (a version 1 file may lack the ``check`` column)."""
    from .columns import OPTIONAL, file_schema

    wanted = file_schema(kind)
    got = schema.remove_metadata()
    if got.equals(wanted, check_metadata=False):
        return
    by_name = {f.name: f for f in got}
    for f in wanted:
        have = by_name.get(f.name)
        if have is None and f.name not in OPTIONAL:
            raise InspectorError(f"{name} lacks the column {f.name}; it was not written by inspector.watch "
                                 "or check_step")
        if have is not None and not have.equals(f):
            raise InspectorError(f"{name}: column {f.name} is {have.type}, not {f.type} as the project "
                                 "writes it: not read")
    extra = [n for n in by_name if wanted.get_field_index(n) < 0]
    if extra:
        raise InspectorError(f"{name} has columns the project never writes ({', '.join(extra[:5])}): "
                             "not read")
    if [f.name for f in got] != [f.name for f in wanted if f.name in by_name]:
        raise InspectorError(f"{name}: its columns are not in the order the project writes them: not read")


def list_lengths(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(lengths, valid)`` of a validated list array's rows (0 for null ones), not copying its values."""
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32, count=len(column) + 1,
                            offset=column.offset * 4) if len(column) else np.zeros(1, np.int32)
    valid = np.ones(len(column), bool) if column.null_count == 0 else \
        ~column.is_null().to_numpy(zero_copy_only=False)
    lengths = np.diff(offsets.astype(np.int64))
    return np.where(valid, lengths, 0), valid


def validate_batch(batch: Any, name: str) -> None:
    """Validate ``batch`` in full (offsets, lengths, UTF-8: nothing is read past its buffers).

    Raises:
        InspectorError: naming ``name`` and the fault.
    """
    import pyarrow as pa

    try:
        batch.validate(full=True)
    except (pa.ArrowException, ValueError) as exc:
        raise InspectorError(f"{name}: a record batch is damaged ({exc}): not read") from None


def check_rows(batch: Any, meta: Any, name: str) -> None:
    """Check the rows of a validated ``batch`` against ``meta``: ranks in ``[-1, world_size)``,
    per-module and per-parameter lists of exactly one number per module or parameter (or null),
    ``scalar_names`` and ``scalar_values`` of one length, at most ``MAX_LRS`` lrs and ``MAX_SCALARS``
    scalar names a row.

    Raises:
        InspectorError: naming ``name`` and the fault.
    """
    ranks = batch.column("rank")
    if ranks.null_count or batch.column("step").null_count:
        raise InspectorError(f"{name}: a row without a step or rank: the file is damaged")
    r = ranks.to_numpy()
    if len(r) and (r.min() < -1 or r.max() >= meta.world_size):
        raise InspectorError(f"{name}: rank {int(r.min() if r.min() < -1 else r.max())} in a run of "
                             f"{meta.world_size} ranks: the file is damaged")
    widths = {"module_grad_norm": len(meta.modules), "module_param_norm": len(meta.modules),
              "module_update_ratio": len(meta.modules), "module_nonfinite": len(meta.modules),
              "param_grad_norm": len(meta.parameters)}
    for col, width in widths.items():
        lengths, valid = list_lengths(batch.column(col))
        if (lengths[valid] != width).any():
            bad = int(lengths[valid][lengths[valid] != width][0])
            raise InspectorError(f"{name}: a row of {col} has {bad:,} values, not one per "
                                 f"{'parameter' if col.startswith('param') else 'module'} ({width:,}): "
                                 "the file is damaged")
    lrs = list_lengths(batch.column("lr"))[0]
    names = list_lengths(batch.column("scalar_names"))[0]
    if (names != list_lengths(batch.column("scalar_values"))[0]).any():
        raise InspectorError(f"{name}: a row has not as many scalar values as scalar names: the file is "
                             "damaged")
    if len(lrs) and lrs.max() > MAX_LRS:
        raise InspectorError(f"{name}: a row has {int(lrs.max()):,} learning rates (at most {MAX_LRS:,})")
    if len(names) and names.max() > MAX_SCALARS:
        raise InspectorError(f"{name}: a row logs {int(names.max()):,} scalars (at most {MAX_SCALARS:,})")


def check_meta(raw: bytes, name: str) -> Any:
    """The :class:`~.columns.RunMeta` of the schema metadata ``raw``, within the limits above.

    Raises:
        InspectorError: naming ``name`` and the fault.
    """
    from .columns import RunMeta

    if len(raw) > MAX_META_BYTES:
        raise InspectorError(f"{name}: {len(raw):,} bytes of run metadata (at most {MAX_META_BYTES:,})")
    items = raw.count(b",") + 1
    if items > MAX_MODULES + 2 * MAX_PARAMETERS + 1000:
        raise InspectorError(f"{name}: run metadata of {items:,} items, more than "
                             f"{MAX_MODULES:,} modules and {MAX_PARAMETERS:,} parameters take")
    try:
        meta = RunMeta.from_json(raw)
    except RecursionError:
        raise InspectorError(f"{name}: its run metadata is nested too deeply to be a run's") from None
    except (ValueError, TypeError, OverflowError, AttributeError, UnicodeDecodeError) as exc:
        raise InspectorError(f"{name}: {exc}") from None
    modules, parameters = len(meta.modules), len(meta.parameters)
    if modules > MAX_MODULES or parameters > MAX_PARAMETERS or meta.world_size > MAX_WORLD:
        raise InspectorError(f"{name}: {modules:,} modules, {parameters:,} parameters and "
                             f"{meta.world_size:,} ranks; at most {MAX_MODULES:,}, {MAX_PARAMETERS:,} and "
                             f"{MAX_WORLD:,}")
    return meta
