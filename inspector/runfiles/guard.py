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
rows of one batch         at most ``MAX_WORLD`` and 1 per 8 bytes of its body (the int64 ``step``)
``MAX_LRS``               100,000 learning rates (param groups) in one row
``MAX_SCALARS``           100,000 logged scalar names in one row
:func:`max_cells`         the steps table (rows × (lrs + distinct scalar names)) at most
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
    """How many cells the steps table of a file of ``file_size`` bytes may have: a file that logs a new
    scalar name on every row would otherwise expand to rows × names of NaN."""
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
_PREFIX = struct.Struct("<Ii").unpack_from
_I32, _U32 = struct.Struct("<i").unpack_from, struct.Struct("<I").unpack_from
_U16, _I64 = struct.Struct("<H").unpack_from, struct.Struct("<q").unpack_from
_U8 = struct.Struct("<B").unpack_from
_MESSAGE_TYPES = {1: "schema", 2: "dictionary batch", 3: "record batch", 4: "tensor", 5: "sparse tensor"}


def message_size(head: bytes | memoryview, at: int = 0) -> tuple[int, int] | None:
    """``(prefix, metadata length)`` of the message at ``at`` of ``head``; None when fewer than its 8
    prefix bytes are there. The end-of-stream marker reads as ``(8, 0)``.

    Raises:
        ValueError: the prefix is not an Arrow message's, or its metadata is over ``MAX_META_BYTES``.
    """
    if len(head) - at < 8:
        return None
    marker, length = _PREFIX(head, at)
    if marker != _CONTINUATION:
        raise ValueError("the bytes there are not an Arrow IPC message (no continuation marker)")
    if length < 0 or length > MAX_META_BYTES:
        raise ValueError(f"a message header of {length:,} bytes (at most {MAX_META_BYTES:,})")
    return 8, length


def _table(buf: bytes, pos: int) -> tuple[int, int, int]:
    """``(position, vtable position, vtable size)`` of the flatbuffer table at ``pos``; every read is
    bounds-checked (``struct`` raises past the end; a negative position is refused here)."""
    vt = pos - _I32(buf, pos)[0] if pos >= 0 else -1
    if vt < 0:
        raise ValueError("a message header points outside itself")
    return pos, vt, _U16(buf, vt)[0]


def field_at(buf: bytes, table: tuple[int, int, int], index: int) -> int:
    """Where field ``index`` of ``table`` is (0 when absent)."""
    pos, vt, size = table
    at = 4 + 2 * index
    if at + 2 > size:
        return 0
    off = _U16(buf, vt + at)[0]
    return pos + off if off else 0


def _vector(buf: bytes, at: int) -> tuple[int, ...]:
    """The int64 pairs of the vector of structs referenced at ``at``, flat (empty when absent)."""
    if not at:
        return ()
    vec = at + _U32(buf, at)[0]
    n = _U32(buf, vec)[0]
    return struct.unpack_from(f"<{2 * n}q", buf, vec + 4)


def message_header(meta: bytes) -> tuple[str, int, tuple[int, int, int] | None]:
    """``(type, body length, header table)`` of a message's flatbuffer ``meta``.

    Raises:
        ValueError, struct.error: ``meta`` is not a valid ``Message`` (an offset outside it, a negative
            body length).
    """
    message = _table(meta, _U32(meta, 0)[0])
    at = field_at(meta, message, 1)
    kind = _MESSAGE_TYPES.get(_U8(meta, at)[0] if at else 0, "unknown")
    at = field_at(meta, message, 3)
    body = _I64(meta, at)[0] if at else 0
    if body < 0:
        raise ValueError(f"a message body of {body} bytes")
    at = field_at(meta, message, 2)
    return kind, body, _table(meta, at + _U32(meta, at)[0]) if at else None


def batch_header(meta: bytes, header: tuple[int, int, int], body: int, name: str) -> int:
    """The rows a record batch header declares, once it is checked against its ``body`` bytes: no
    compressed body, every buffer inside the body, at most ``MAX_WORLD`` rows (and 1 per 8 bytes:
    the int64 ``step`` column) and no column longer than the body's bits.

    Raises:
        InspectorError: naming ``name`` and the fault.
    """
    at = field_at(meta, header, 0)
    rows = _I64(meta, at)[0] if at else 0
    if field_at(meta, header, 3):
        raise InspectorError(f"{name}: a record batch with compressed buffers (LZ4/ZSTD); a run file is "
                             "never compressed: not read")
    if rows < 0 or rows > min(MAX_WORLD, body // 8):
        raise InspectorError(f"{name}: a record batch declares {rows:,} rows in {body:,} bytes; at most "
                             f"{min(MAX_WORLD, body // 8):,} fit: the file is damaged or forged")
    nodes, buffers = batch_layout(meta, header)
    if nodes and (min(nodes) < 0 or max(nodes[0::2]) > 8 * body + 8):
        raise InspectorError(f"{name}: a column declares more values than its {body:,} bytes hold")
    if buffers and (min(buffers) < 0 or max(map(sum, zip(buffers[0::2], buffers[1::2], strict=True))) > body):
        raise InspectorError(f"{name}: a buffer lies outside its record batch's {body:,} bytes")
    return rows


def batch_layout(meta: bytes, header: tuple[int, int, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(nodes, buffers)`` of a record batch header: each column's ``(length, null count)`` and each
    buffer's ``(offset, length)`` in the body, as flat tuples in Arrow's order."""
    return _vector(meta, field_at(meta, header, 1)), _vector(meta, field_at(meta, header, 2))


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
