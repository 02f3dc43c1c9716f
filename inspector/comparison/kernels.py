"""How far one tensor moved: bitwise equality, max abs change, ‖B−A‖ and ‖A‖, nonfinite counts.

The arithmetic runs in numpy on chunks of ``CHUNK`` elements, single-threaded and in cache:
one pass computes the difference, its largest magnitude and both sums of squares, and an equal
chunk costs only a byte comparison (until one chunk differs; later chunks are not compared
bytewise). Every dtype is widened chunk by chunk to float32 (float64 for float64 and wide
integers), so memory stays at the two tensors plus one chunk; two dtypes are compared the same
way. A changed matrix also feeds a random submatrix of B − A (:class:`RankSketch`) that says
whether the change is low-rank, as a merged adapter is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

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
        """‖B−A‖ / ‖A‖ (0 when nothing changed; NaN when A is all zeros and B is not: a tensor
        initialised to zero, whose change is ``diff_norm`` itself, has no ratio)."""
        if self.diff_norm == 0:
            return 0.0
        return self.diff_norm / self.norm_a if self.norm_a else math.nan


def _raw(t: torch.Tensor) -> np.ndarray:
    """The bytes of a real ``t`` as a flat integer array (any dtype, bool and bfloat16 included)."""
    t = t.contiguous().reshape(-1)
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    return t.view(_INT_VIEWS[t.element_size()]).numpy()


def wide_dtype(dtype: torch.dtype) -> type:
    """The numpy float type one side's values are compared in: float64 for float64 and integers wider
    than 16 bits, float32 for every other dtype (float16, bfloat16 and both float8 kinds included)."""
    if dtype == torch.float64 or (not dtype.is_floating_point and dtype.itemsize > 2):
        return np.float64
    return np.float32


def _widen(raw: np.ndarray, dtype: torch.dtype, out: np.ndarray) -> np.ndarray:
    """One chunk of raw values as ``out``'s float type (written into ``out`` unless no copy is needed)."""
    target = out.dtype
    if (dtype == torch.float32 and target == np.float32) or (dtype == torch.float64 and target == np.float64):
        return raw.view(target)
    if dtype == torch.bfloat16 and target == np.float32:
        wide = out[: raw.size].view(np.uint32)
        np.left_shift(raw.view(np.uint16).astype(np.uint32), 16, out=wide)
        return wide.view(np.float32)
    if dtype == torch.float16:
        return _into(out, raw.view(np.float16))
    if dtype in (torch.float32, torch.float64):
        return _into(out, raw.view(np.float32 if dtype == torch.float32 else np.float64))
    # float8, bool, integers: torch converts them (numpy has no float8)
    return _into(out, torch.from_numpy(raw).view(dtype).to(
        torch.float32 if target == np.float32 else torch.float64).numpy())


def _into(out: np.ndarray, values: np.ndarray) -> np.ndarray:
    np.copyto(out[: values.size], values, casting="unsafe")
    return out[: values.size]


LOW_RANK_TOLERANCE = 0.01
SAMPLED = 128


def _pick(size: int, rng: np.random.Generator) -> np.ndarray:
    return np.arange(size) if size <= SAMPLED else np.sort(rng.choice(size, SAMPLED, replace=False))


class RankSketch:
    """``B − A`` at ``SAMPLED`` random rows and ``SAMPLED`` random columns (all of a smaller side),
    gathered from its flat difference chunks in any order: a random submatrix. ``rank()`` reads the
    rank of ``B − A`` off the submatrix's singular values: a product of an ``m × r`` and an ``r × n``
    factor keeps rank ``r`` in almost every submatrix of ``r`` rows and columns or more. Cost: a
    pivoted QR of the submatrix per matrix; memory ``SAMPLED²`` floats."""

    def __init__(self, rows: int, cols: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.rows, self.cols = rows, cols
        self.picked_rows, self.picked_cols = _pick(rows, rng), _pick(cols, rng)
        self.sample = np.zeros((len(self.picked_rows), len(self.picked_cols)), dtype=np.float64)

    def add(self, d: np.ndarray, pos: int) -> None:
        """Take the differences of the flat elements ``pos .. pos + d.size``."""
        n = self.cols
        lo, hi = np.searchsorted(self.picked_rows, [pos // n, (pos + d.size - 1) // n + 1])
        if lo == hi:
            return
        where = (self.picked_rows[lo:hi, None] * n - pos) + self.picked_cols[None, :]  # into d
        inside = (where >= 0) & (where < d.size)
        self.sample[lo:hi][inside] = d[where[inside]]

    def rank(self, tolerance: float = LOW_RANK_TOLERANCE) -> int | None:
        """The smallest ``r`` whose rank-``r`` approximation of the sample by QR with column pivoting
        (the largest column left, projected out, ``r`` times) leaves at most ``tolerance`` of its
        norm; None when that is more than half the sample's smaller side (the change is not low-rank)
        or the sample holds no change. Elementwise numpy only: no BLAS threads, which a busy machine
        slows a hundredfold on matrices this small."""
        x = self.sample.copy()
        norms = np.einsum("ij,ij->j", x, x)
        total = float(norms.sum())
        if not math.isfinite(total) or total == 0:
            return None
        limit, left = min(x.shape) // 2, total
        for r in range(1, limit + 1):
            j = int(np.argmax(norms))
            q = x[:, j] / math.sqrt(norms[j])
            x -= np.multiply.outer(q, np.einsum("i,ij->j", q, x))
            norms = np.einsum("ij,ij->j", x, x)
            removed, left = left - float(norms.sum()), float(norms.sum())
            if left <= tolerance ** 2 * total:
                return r
            if left > 4 * removed * (limit - r):  # the steps left cannot remove that much: not low-rank
                return None
        return None


def sketchable(shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    """Whether a change of this tensor gets a rank: a floating matrix with at least 4 rows and columns."""
    return len(shape) == 2 and dtype.is_floating_point and min(shape) >= 4


class StatsStream:
    """Builds :class:`PairStats` from aligned chunks of two tensors' raw values, fed in order.

    A chunk is a flat integer array of the tensor's raw bytes (:func:`raw_values`); A's and B's
    chunk of one call hold the same elements. ``dtype_b`` (default ``dtype``) may differ: then both
    sides are widened (:func:`wide_dtype`), the pair is never bitwise equal, and ``exact_cast``
    says whether B is A cast to B's dtype. ``shape``: a matrix's shape, for the low-rank sketch.
    Memory: the chunks plus a few float scratch chunks (and the sketch).
    """

    def __init__(self, dtype: torch.dtype, dtype_b: torch.dtype | None = None,
                 shape: tuple[int, ...] | None = None) -> None:
        self.dtype, self.dtype_b = dtype, dtype_b if dtype_b is not None else dtype
        self.cast = self.dtype_b != dtype
        self.wide = np.float64 if np.float64 in (wide_dtype(dtype), wide_dtype(self.dtype_b)) else np.float32
        self.equal, self.max_abs, self.sq_d, self.sq_a = not self.cast, 0.0, 0.0, 0.0
        self.exact = self.cast
        self.nonfinite_a = self.nonfinite_b = 0
        self.pos = 0
        self.sketch = (RankSketch(shape[0], shape[1]) if shape is not None and not self.cast
                       and sketchable(shape, dtype) else None)
        self._scratch: dict[str, np.ndarray] = {}

    def _buffer(self, key: str, size: int, dtype: type) -> np.ndarray:
        buf = self._scratch.get(key)
        if buf is None or buf.size < size or buf.dtype != dtype:
            buf = self._scratch[key] = np.empty(size, dtype=dtype)
        return buf[:size]

    def add(self, ca: np.ndarray, cb: np.ndarray) -> None:
        """Take one pair of aligned raw chunks."""
        pos, self.pos = self.pos, self.pos + ca.size
        same = self.equal and np.array_equal(
            ca, cb
        )  # once a chunk differed, the rest are subtracted unchecked
        self.equal = bool(same)
        fa = _widen(ca, self.dtype, self._buffer("a", ca.size, self.wide))
        sq_a = float(np.dot(fa, fa))
        if same:
            if not math.isfinite(sq_a):
                bad = self._nonfinite(fa, self.dtype)
                self.nonfinite_a += bad
                self.nonfinite_b += bad
            self.sq_a += sq_a
            return
        if self.exact:
            cast = torch.from_numpy(ca).view(self.dtype).to(self.dtype_b)
            self.exact = bool(np.array_equal(_raw(cast), cb))
        fb = _widen(cb, self.dtype_b, self._buffer("b", cb.size, self.wide))
        d = np.subtract(fb, fa, out=self._buffer("d", fa.size, self.wide))
        sq_d = float(np.dot(d, d))
        if not (math.isfinite(sq_a) and math.isfinite(sq_d)):
            self.nonfinite_a += self._nonfinite(fa, self.dtype)
            self.nonfinite_b += self._nonfinite(fb, self.dtype_b)
        elif self.sketch is not None and sq_d:
            self.sketch.add(d, pos)
        self.sq_a += sq_a
        self.sq_d += sq_d
        if d.size:
            self.max_abs = max(self.max_abs, float(d.max()), -float(d.min()))

    @staticmethod
    def _nonfinite(values: np.ndarray, dtype: torch.dtype) -> int:
        return int(values.size - np.count_nonzero(np.isfinite(values))) if dtype.is_floating_point else 0

    def update_rank(self) -> int | None:
        """The rank of B − A within ``LOW_RANK_TOLERANCE`` where it is low (:class:`RankSketch`), else
        None (not a sketched matrix, unchanged, not low-rank, or not finite)."""
        if self.sketch is None or self.equal or self.nonfinite_a or self.nonfinite_b:
            return None
        return self.sketch.rank()

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
    """Compare two CPU tensors of one shape, chunk by chunk (in float32, or float64 for float64 and
    wide integers, whatever the dtypes: float8 too); neither is changed. Tensors of two dtypes are
    never bitwise equal.

    >>> s = pair_stats(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 5.0]))
    >>> s.bitwise_equal, s.max_abs, s.diff_norm, s.norm_a
    (False, 1.0, 1.0, 5.0)
    """
    if a.dtype != b.dtype and (a.dtype.is_complex or b.dtype.is_complex):
        a, b = a.to(torch.complex128), b.to(torch.complex128)
        return replace(pair_stats(a, b), bitwise_equal=False)
    ra, rb = raw_values(a), raw_values(b)
    stream = StatsStream(stream_dtype(a.dtype), stream_dtype(b.dtype))
    for start in range(0, ra.size, CHUNK):
        stream.add(ra[start:start + CHUNK], rb[start:start + CHUNK])
    return stream.finish()
