"""The low-rank estimate of a change: a random submatrix gathered from chunks that cut rows anywhere."""

from __future__ import annotations

import numpy as np
import torch

from inspector.comparison.kernels import RankSketch, StatsStream, raw_values


def _streamed(a: torch.Tensor, b: torch.Tensor, chunk: int) -> StatsStream:
    stream = StatsStream(torch.float32, shape=tuple(a.shape))
    ra, rb = raw_values(a), raw_values(b)
    for start in range(0, ra.size, chunk):
        stream.add(ra[start:start + chunk], rb[start:start + chunk])
    return stream


def test_the_sample_is_the_submatrix_whatever_the_chunks():
    torch.manual_seed(0)
    a = torch.randn(300, 200)
    d = torch.randn(300, 200)
    stream = _streamed(a, a + d, chunk=777)  # 777 is no multiple of 200: chunks start mid-row
    sketch = stream.sketch
    assert isinstance(sketch, RankSketch) and sketch.sample.shape == (128, 128)
    # the gathered differences are those of the picked rows and columns (float32 arithmetic of B - A)
    expected = ((a + d) - a).numpy()[np.ix_(sketch.picked_rows, sketch.picked_cols)]
    assert np.array_equal(sketch.sample, expected.astype(np.float64))


def test_ranks_of_exact_low_rank_changes_and_none_for_full_rank_ones():
    torch.manual_seed(0)
    a = torch.randn(300, 200)
    for rank in (1, 5, 32):
        low = torch.randn(300, rank) @ torch.randn(rank, 200) * 0.1
        assert _streamed(a, a + low, chunk=1000).update_rank() == rank
    assert _streamed(a, a + torch.randn(300, 200), chunk=1000).update_rank() is None
    assert _streamed(a, a.clone(), chunk=1000).update_rank() is None  # unchanged: no rank
    # a small matrix is sampled whole: its rank is exact up to half its smaller side
    small = torch.randn(8, 6)
    assert _streamed(small, small + torch.ones(8, 1) @ torch.ones(1, 6), chunk=5).update_rank() == 1
