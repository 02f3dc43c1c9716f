"""Record batches laid out alike, read at once.

The watch writes one record batch per step, and the batches of a healthy run are laid out alike: the
same message header byte for byte (rows, each column's length and null count, each buffer's place and
size in the body), only the numbers in the body differ. Read one at a time, each such message costs
tens of microseconds in Arrow, more than its numbers; appended at tens of megabytes a second, a
followed run falls behind its writer. :func:`alike` counts the messages from a point that repeat the
first one's header; :func:`read_alike` reads them as one record batch by gathering each buffer of
every body with numpy (a strided copy per buffer, not a pass per message): offsets rebased, bitmaps
re-packed, strings compacted.

It reads only what the checked header (:func:`~.guard.batch_header`) allows, and anything it does not
read exactly as Arrow would (a layout it does not know, offsets that do not start at 0 or end at their
child's length, a bitmap shorter than its column, a column not as long as the header's rows, a null
count its bitmap does not bear out, struct children longer than their struct, a buffer not 8-byte
aligned) makes it return None: the caller then reads those messages one by one as before, where Arrow
and the guard say what is wrong. A batch it returns is validated in full like any other. Besides the
copy it holds a few ``SPAN`` bytes at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

ALIKE_MIN = 4  # messages in a row before reading them at once is worth it
MAX_OFFSET = (1 << 31) - 1  # int32 offsets of a merged string or list column
SPAN = 1 << 20  # bytes of the bodies a bitmap or string gather holds unpacked at a time


class _Unlike(Exception):
    """The messages are not laid out as :func:`read_alike` reads them."""


def alike(view: memoryview, at: int, size: int, body: int, limit: int) -> int:
    """How many whole messages from ``at`` in ``view``, the one at ``at`` first, have the same
    ``size`` bytes of prefix and header as it (so the same ``body`` length), one after another; at most
    ``limit``. Compares twice as many headers as it finds alike, at most: a message unlike the next costs
    one comparison."""
    stride = size + body
    n = min(limit, (len(view) - at) // stride)
    if n < 2:
        return max(n, 0)
    frames = np.frombuffer(view, np.uint8, count=n * stride, offset=at).reshape(n, stride)[:, :size]
    done = 1
    while done < n:  # 1, 2, 4, ... more headers at a time, up to the first unlike one
        upto = min(n, 2 * done)
        same = (frames[done:upto] == frames[0]).all(axis=1)
        if not same.all():
            return done + int(np.argmin(same))
        done = upto
    return n


def read_alike(view: memoryview, at: int, count: int, size: int, body: int, rows: int,
               nodes: tuple[int, ...], buffers: tuple[int, ...], schema: Any) -> Any:
    """The ``count`` messages at ``at`` (each ``size`` bytes of prefix and header, then ``body`` bytes,
    all with the header of ``rows`` rows whose field nodes and buffers are ``nodes`` and ``buffers``, flat
    pairs as :func:`~.guard.batch_layout` gives them) as one record batch of ``schema``, a copy, validated
    in full; None when they are not laid out as this reads them or do not validate (read them one by one
    instead: that read names the fault). Besides the copy, it holds at most a few ``SPAN`` bytes at a
    time."""
    import pyarrow as pa

    if any(place % 8 for place in buffers[0::2]):  # Arrow refuses a buffer not 8-byte aligned
        return None
    stride = size + body
    bodies = np.frombuffer(view, np.uint8, count=count * stride, offset=at).reshape(count, stride)[:, size:]
    node_it = iter(zip(nodes[0::2], nodes[1::2], strict=True))
    buffer_it = iter(zip(buffers[0::2], buffers[1::2], strict=True))
    try:
        arrays = [_array(f.type, bodies, node_it, buffer_it) for f in schema]
        if (next(node_it, None) is not None or next(buffer_it, None) is not None
                or any(len(a) != rows * count for a in arrays)):  # each column as long as the batch
            return None
        batch = pa.RecordBatch.from_arrays(arrays, schema=schema)
        batch.validate(full=True)  # offsets, lengths, UTF-8: a fault is named by the one-by-one read
        return batch
    except (_Unlike, ValueError, pa.ArrowException):
        return None


def _next(it: Iterator[tuple[int, int]]) -> tuple[int, int]:
    got = next(it, None)
    if got is None:
        raise _Unlike
    return got


def _array(typ: Any, bodies: np.ndarray, nodes: Iterator, buffers: Iterator) -> Any:
    """The column of type ``typ`` of every body, its node and buffers taken from the iterators in
    Arrow's order (pre-order: a node per field; validity, then offsets or data, then the children)."""
    import pyarrow as pa

    count = len(bodies)
    length, nulls = _next(nodes)
    validity = _next(buffers)
    total = length * count
    bitmap, zeros = (None, 0) if nulls == 0 else _bits(bodies, validity, length)
    if zeros != nulls * count:  # Arrow takes the declared count, and full validation refuses a wrong one
        raise _Unlike
    if pa.types.is_boolean(typ):
        data, _ = _bits(bodies, _next(buffers), length)
        return pa.Array.from_buffers(typ, total, [bitmap, data], nulls * count)
    if pa.types.is_string(typ):
        offsets = _offsets(bodies, _next(buffers), length)
        at, n = _next(buffers)
        ends = offsets[:, -1].astype(np.int64)
        if (offsets[:, 0] != 0).any() or (ends > n).any():
            raise _Unlike
        starts = np.cumsum(ends) - ends
        return pa.Array.from_buffers(typ, total, [bitmap, _rebased(offsets, starts),
                                                  _chars(bodies[:, at:at + n], starts, ends)], nulls * count)
    if pa.types.is_list(typ):
        offsets = _offsets(bodies, _next(buffers), length)
        child = _array(typ.value_type, bodies, nodes, buffers)
        per = len(child) // count
        if (offsets[:, 0] != 0).any() or (offsets[:, -1] != per).any():
            raise _Unlike
        return pa.Array.from_buffers(typ, total, [bitmap, _rebased(offsets, np.arange(count) * per)],
                                     nulls * count, children=[child])
    if pa.types.is_struct(typ):
        children = [_array(typ.field(i).type, bodies, nodes, buffers) for i in range(typ.num_fields)]
        if any(len(c) != total for c in children):  # Arrow allows longer children; merged they would shift
            raise _Unlike
        return pa.Array.from_buffers(typ, total, [bitmap], nulls * count, children=children)
    width = getattr(typ, "bit_width", 0)
    if not (pa.types.is_integer(typ) or pa.types.is_floating(typ)) or width % 8:
        raise _Unlike
    at, n = _next(buffers)
    if length * width // 8 > n:
        raise _Unlike
    return pa.Array.from_buffers(typ, total, [bitmap, pa.py_buffer(
        np.ascontiguousarray(bodies[:, at:at + length * width // 8]))], nulls * count)


def _bits(bodies: np.ndarray, buffer: tuple[int, int], length: int) -> tuple[Any, int]:
    """The bitmap ``buffer`` of ``length`` bits of every body, one after another; and its 0 bits. Bits
    are unpacked ``SPAN`` bytes of bodies at a time (8 bytes a bit), and not at all when ``length`` is
    whole bytes."""
    import pyarrow as pa

    at, n = buffer
    width = (length + 7) // 8
    if width > n:
        raise _Unlike
    count = len(bodies)
    src = bodies[:, at:at + width]
    if length % 8 == 0:
        packed = np.ascontiguousarray(src).reshape(-1)
    else:
        packed = np.empty((count * length + 7) // 8, np.uint8)
        step = 8 * max(1, SPAN // (64 * width))  # bodies a pass, a multiple of 8: a pass ends on a byte
        for i in range(0, count, step):
            bits = np.unpackbits(src[i:i + step], axis=1, count=length, bitorder="little")
            part = np.packbits(bits, bitorder="little")
            packed[i * length // 8:i * length // 8 + len(part)] = part
    ones = sum(int(np.bitwise_count(packed[i:i + SPAN]).sum()) for i in range(0, len(packed), SPAN))
    return pa.py_buffer(packed), count * length - ones


def _offsets(bodies: np.ndarray, buffer: tuple[int, int], length: int) -> np.ndarray:
    """The ``length + 1`` int32 offsets of ``buffer`` in every body (count × (length + 1), a view of the
    bodies), each body's checked to never decrease."""
    at, n = buffer
    if length == 0 and n == 0:  # an empty column may carry no offsets at all (but not part of one)
        return np.zeros((len(bodies), 1), "<i4")
    if 4 * (length + 1) > n:
        raise _Unlike
    offsets = bodies[:, at:at + 4 * (length + 1)].view("<i4")
    if (offsets[:, 1:] < offsets[:, :-1]).any():
        raise _Unlike
    return offsets


def _rebased(offsets: np.ndarray, base: np.ndarray) -> Any:
    """One offsets buffer of the bodies' ``offsets`` (each starting at 0 and never decreasing), body
    ``k``'s moved by ``base[k]`` (ascending); the last body's end closes it. Computed in int32, once its
    last offset is known to fit."""
    import pyarrow as pa

    count, width = offsets.shape
    last = int(base[-1]) + int(offsets[-1, -1])
    if last > MAX_OFFSET:
        raise _Unlike
    merged = np.empty(count * (width - 1) + 1, "<i4")
    np.add(offsets[:, :-1], base.astype("<i4")[:, None], out=merged[:-1].reshape(count, width - 1))
    merged[-1] = last
    return pa.py_buffer(merged)


def _chars(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Any:
    """The first ``ends[k]`` bytes of each row ``k`` of ``data``, one after another (row ``k``'s at
    ``starts[k]``), gathered ``SPAN`` bytes of rows at a time."""
    import pyarrow as pa

    count, n = data.shape
    chars = np.empty(int(ends.sum()), np.uint8)
    step = max(1, SPAN // max(n, 1))
    for i in range(0, count, step):
        part = data[i:i + step]
        got = part[np.arange(n) < ends[i:i + step, None]]
        chars[starts[i]:starts[i] + len(got)] = got
    return pa.py_buffer(chars)
