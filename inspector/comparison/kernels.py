"""How far one tensor moved: bitwise equality, max abs change, ‖B−A‖ and ‖A‖, nonfinite counts.

The arithmetic runs in numpy on chunks of ``CHUNK`` elements, single-threaded and in cache:
one pass computes the difference, its largest magnitude and both sums of squares, and an equal
chunk costs only a byte comparison (until one chunk differs; later chunks are not compared
bytewise). bfloat16 and float16 are widened to float32 chunk by chunk, so memory stays at the two
tensors plus one chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

CHUNK = 1 << 18
_INT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class PairStats:
    """``bitwise_equal``; ``max_abs`` = max |B−A|; ``diff_norm`` = ‖B−A‖; ``norm_a`` = ‖A‖;
    nonfinite element counts of each side. Norms are NaN where a side holds NaN or Inf."""

    bitwise_equal: bool
    max_abs: float
    diff_norm: float
    norm_a: float
    nonfinite_a: int
    nonfinite_b: int

    @property
    def rel_change(self) -> float:
        """‖B−A‖ / ‖A‖ (0 when both are 0, inf when only A is)."""
        if self.diff_norm == 0:
            return 0.0
        return self.diff_norm / self.norm_a if self.norm_a else math.inf


def _raw(t: torch.Tensor) -> np.ndarray:
    """The bytes of a real ``t`` as a flat integer array (any dtype, bool and bfloat16 included)."""
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return t.view(_INT_VIEWS[t.element_size()]).numpy()


def _widen(raw: np.ndarray, dtype: torch.dtype, out: np.ndarray) -> np.ndarray:
    """One chunk of raw values as float32 (float64 for float64 and 64-bit integers)."""
    if dtype == torch.float32 or dtype == torch.float64:
        return raw.view(np.float32 if dtype == torch.float32 else np.float64)
    if dtype == torch.bfloat16:
        wide = out[: raw.size].view(np.uint32)
        np.left_shift(raw.view(np.uint16).astype(np.uint32), 16, out=wide)
        return wide.view(np.float32)
    if dtype == torch.float16:
        return raw.view(np.float16).astype(np.float32)
    return torch.from_numpy(raw).view(dtype).to(torch.float64).numpy()


class StatsStream:
    """Builds :class:`PairStats` from aligned chunks of two tensors' raw values, fed in order.

    A chunk is a flat integer array of the tensor's raw bytes (:func:`raw_values`); A's and B's
    chunk of one call hold the same elements. Memory: the chunks plus three float scratch chunks.
    """

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.equal, self.max_abs, self.sq_d, self.sq_a = True, 0.0, 0.0, 0.0
        self.nonfinite_a = self.nonfinite_b = 0
        self._scratch: dict[str, np.ndarray] = {}

    def _buffer(self, key: str, size: int, dtype: type) -> np.ndarray:
        buf = self._scratch.get(key)
        if buf is None or buf.size < size or buf.dtype != dtype:
            buf = self._scratch[key] = np.empty(size, dtype=dtype)
        return buf[:size]

    def add(self, ca: np.ndarray, cb: np.ndarray) -> None:
        """Take one pair of aligned raw chunks."""
        same = self.equal and np.array_equal(
            ca, cb
        )  # once a chunk differed, the rest are subtracted unchecked
        self.equal = same
        fa = _widen(ca, self.dtype, self._buffer("a", ca.size, np.float32))
        sq_a = float(np.dot(fa, fa))
        if same:
            if not math.isfinite(sq_a):
                bad = self._nonfinite(fa)
                self.nonfinite_a += bad
                self.nonfinite_b += bad
            self.sq_a += sq_a
            return
        fb = _widen(cb, self.dtype, self._buffer("b", cb.size, np.float32))
        d = np.subtract(fb, fa, out=self._buffer("d", fa.size, fa.dtype.type))
        sq_d = float(np.dot(d, d))
        if not (math.isfinite(sq_a) and math.isfinite(sq_d)):
            self.nonfinite_a += self._nonfinite(fa)
            self.nonfinite_b += self._nonfinite(fb)
        self.sq_a += sq_a
        self.sq_d += sq_d
        self.max_abs = max(self.max_abs, float(d.max()), -float(d.min()))

    def _nonfinite(self, values: np.ndarray) -> int:
        return int(values.size - np.count_nonzero(np.isfinite(values))) if self.dtype.is_floating_point else 0

    def finish(self) -> PairStats:
        if self.equal:
            return PairStats(
                True, 0.0, 0.0, _root(self.sq_a, self.nonfinite_a), self.nonfinite_a, self.nonfinite_b
            )
        broken = self.nonfinite_a or self.nonfinite_b
        return PairStats(
            False,
            math.nan if broken else self.max_abs,
            math.nan if broken else math.sqrt(self.sq_d),
            _root(self.sq_a, self.nonfinite_a),
            self.nonfinite_a,
            self.nonfinite_b,
        )


def _root(sq: float, nonfinite: int) -> float:
    return math.nan if nonfinite else math.sqrt(sq)


def raw_values(t: torch.Tensor) -> np.ndarray:
    """The raw values of a CPU tensor as a flat integer array of its element size (no copy when
    contiguous)."""
    if t.dtype.is_complex:
        t = torch.view_as_real(t)
    return _raw(t)


def stream_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype whose elements :func:`raw_values` yields for ``dtype`` (a complex one's real part)."""
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)


def pair_stats(a: torch.Tensor, b: torch.Tensor) -> PairStats:
    """Compare two CPU tensors of one shape and dtype, chunk by chunk; neither is changed.

    >>> s = pair_stats(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 5.0]))
    >>> s.bitwise_equal, s.max_abs, s.diff_norm, s.norm_a
    (False, 1.0, 1.0, 5.0)
    """
    ra, rb = raw_values(a), raw_values(b)
    stream = StatsStream(stream_dtype(a.dtype))
    for start in range(0, ra.size, CHUNK):
        stream.add(ra[start:start + CHUNK], rb[start:start + CHUNK])
    return stream.finish()
