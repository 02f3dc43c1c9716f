"""How far one tensor moved: bitwise equality, max abs change, ‖B−A‖ and ‖A‖, nonfinite counts.

The arithmetic runs in numpy on chunks of ``CHUNK`` elements, single-threaded and in cache:
one pass computes the difference, its largest magnitude and both sums of squares, and an equal
chunk costs only a byte comparison. bfloat16 and float16 are widened to float32 chunk by chunk,
so memory stays at the two tensors plus one chunk.
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
    """The bytes of ``t`` as a flat integer array (any dtype, bool and bfloat16 included)."""
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


def pair_stats(a: torch.Tensor, b: torch.Tensor) -> PairStats:
    """Compare two CPU tensors of one shape and dtype, chunk by chunk; neither is changed.

    >>> s = pair_stats(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 5.0]))
    >>> s.bitwise_equal, s.max_abs, s.diff_norm, s.norm_a
    (False, 1.0, 1.0, 5.0)
    """
    if a.dtype.is_complex:
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    ra, rb = _raw(a), _raw(b)
    dtype = a.dtype
    equal, max_abs, sq_d, sq_a = True, 0.0, 0.0, 0.0
    scratch_a = np.empty(min(CHUNK, ra.size), dtype=np.float32)
    scratch_b = np.empty_like(scratch_a)
    scratch_d: np.ndarray | None = None
    for start in range(0, ra.size, CHUNK):
        ca, cb = ra[start:start + CHUNK], rb[start:start + CHUNK]
        same = np.array_equal(ca, cb)
        equal = equal and same
        fa = _widen(ca, dtype, scratch_a)
        sq_a += float(np.dot(fa, fa))
        if same:
            continue
        fb = _widen(cb, dtype, scratch_b)
        if scratch_d is None or scratch_d.dtype != fa.dtype:
            scratch_d = np.empty(min(CHUNK, ra.size), dtype=fa.dtype)
        d = np.subtract(fb, fa, out=scratch_d[: fa.size])
        hi, lo = float(d.max()), float(d.min())
        max_abs = max(max_abs, hi, -lo) if not (math.isnan(hi) or math.isnan(lo)) else math.nan
        sq_d += float(np.dot(d, d))
    nonfinite_a = nonfinite_b = 0
    if not (math.isfinite(sq_a) and math.isfinite(sq_d) and math.isfinite(max_abs)) and dtype.is_floating_point:
        nonfinite_a = int((~torch.isfinite(a)).sum())
        nonfinite_b = int((~torch.isfinite(b)).sum())
        if nonfinite_a or nonfinite_b:
            sq_d = max_abs = math.nan
        if nonfinite_a:
            sq_a = math.nan
    return PairStats(equal, 0.0 if equal else max_abs, 0.0 if equal else math.sqrt(sq_d), math.sqrt(sq_a),
                     nonfinite_a, nonfinite_b)


def nonfinite_count(t: torch.Tensor) -> int:
    """NaN and Inf elements of ``t`` (0 for integer and bool tensors)."""
    return int((~torch.isfinite(t)).sum()) if t.dtype.is_floating_point or t.dtype.is_complex else 0
