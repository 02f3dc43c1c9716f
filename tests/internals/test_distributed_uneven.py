"""Every per-rank statistic of a distributed step on uneven shards: each rank's own element count.

FSDP splits dimension 0 with ``torch.chunk``: a (5, 4) weight on 3 ranks is 2 + 2 + 1 rows (8, 8 and 4
elements), a (3, 4) weight on 2 ranks is 2 + 1 rows (8 and 4). A rank's gradient RMS per element divides
its own squared norm by its own count; with rank 0's count for every rank, a far-off rank is hidden
and a healthy one is named.
"""

from __future__ import annotations

import math

import pytest

from inspector.distributed.findings import step_findings


def _row(name, per_element, local_numel, placements="Shard(0)", nan=None, inf=None):
    """A sharded parameter whose every local gradient element is ``per_element[rank]``."""
    world = len(local_numel)
    norms = [g * math.sqrt(n) for g, n in zip(per_element, local_numel, strict=True)]
    return {"name": name, "kind": "parameter", "placements": placements, "local_grad_norm": norms,
            "local_numel": local_numel, "nan": nan or [0] * world, "inf": inf or [0] * world,
            "replica_key": [-1] * world, "hash": [[0, 0]] * world}


def _record(rows, world):
    return {"step": 3, "world_size": world, "tensors": rows}


def _found(record, **kw):
    return [(f.code, f.where) for f in step_findings(record, **kw)]


def test_the_same_gradient_per_element_on_uneven_shards_is_not_far_off():
    # weight (5, 4): 8/8/4 elements, bias (5,): 2/2/1; every element's gradient 0.5 on every rank:
    # each rank's RMS is 0.5 whatever it holds. The shards themselves are uneven: 10/10/5, mean 8.33,
    # rank 0 +20.0%
    rows = [_row("w", [0.5] * 3, [8, 8, 4]), _row("b", [0.5] * 3, [2, 2, 1])]
    found = step_findings(_record(rows, 3))
    assert [(f.code, f.where) for f in found] == [("shard-imbalance", "rank 0")]
    assert "rank 0 holds 10 sharded parameter elements, 20.0% above the mean of 8 (per rank: 10, 10, 5)" \
        in found[0].message
    assert "w (8/8/4), b (2/2/1)" in found[0].message


def test_a_rank_far_above_on_a_smaller_shard_is_named_with_its_own_count():
    # per element 1, 1 and 12 on 8/8/4 elements: RMS 1, 1, 12 -> 12x the median. Counting 8 elements
    # on rank 2 would give sqrt(144 * 4 / 8) = 8.49: under the factor 10, not named
    rows = [_row("w", [1.0, 1.0, 12.0], [8, 8, 4])]
    found = [f for f in step_findings(_record(rows, 3)) if f.code == "gradient-far-off"]
    assert [f.where for f in found] == ["rank 2"]
    assert "rank 2's gradients are 12x larger per element than the median of the 3 ranks (RMS 12 against 1)" \
        in found[0].message


def test_a_healthy_rank_on_a_smaller_shard_is_not_named():
    # per element 1, 1 and 0.12 on 8/8/4 elements: 8.33x below the median, inside the factor 10.
    # Counting 8 elements on rank 2 would give sqrt(0.0144 * 4 / 8) = 0.0849: 11.8x, a false finding
    rows = [_row("w", [1.0, 1.0, 0.12], [8, 8, 4])]
    assert _found(_record(rows, 3)) == [("shard-imbalance", "rank 0")]


def test_two_ranks_on_uneven_shards_compare_per_element():
    # (3, 4) weight on 2 ranks: 8 and 4 elements; per element 1 and 12 -> 12x, named.
    # With 8 elements on rank 1 it would be 8.49x and silent
    rows = [_row("w", [1.0, 12.0], [8, 4])]
    found = [f for f in step_findings(_record(rows, 2)) if f.code == "gradient-far-off"]
    assert [f.where for f in found] == ["ranks 0 and 1"]
    assert "rank 1's gradients are 12x larger per element than rank 0's (RMS 12 against 1)" \
        in found[0].message
    assert _found(_record([_row("w", [1.0, 9.0], [8, 4])], 2)) == [("shard-imbalance", "rank 0")]


def test_a_rank_whose_larger_shard_holds_the_same_norm_is_far_below():
    # the imbalance the other way: rank 0 holds 12 elements of a (9, 4) weight's 4 ranks (3/3/3/0 rows),
    # rank 3 none (no RMS); the same squared norm over 12 elements on ranks 0-2 and a 100x smaller one
    # per element on rank 1
    rows = [_row("w", [1.0, 0.01, 1.0, 0.0], [12, 12, 12, 0])]
    found = step_findings(_record(rows, 4), far_factor=10.0)
    far = [f for f in found if f.code == "gradient-far-off"]
    assert [f.where for f in far] == ["rank 1"]
    assert "100x smaller per element than the median of the 3 ranks (RMS 0.01 against 1)" in far[0].message
    imbalance = [f for f in found if f.code == "shard-imbalance"]
    assert "rank 0 holds 12 sharded parameter elements, 33.3% above the mean of 9 (per rank: 12, 12, 12, 0)" \
        in imbalance[0].message


def test_non_finite_pieces_of_uneven_shards_are_counted_per_rank():
    # rank 2's single row of w holds 4 Inf in its values; the other ranks' 8 elements are finite
    rows = [_row("w", [1.0, 1.0, 1.0], [8, 8, 4])]
    rows[0]["value_nan"], rows[0]["value_inf"] = [0, 0, 0], [0, 0, 4]
    found = step_findings(_record(rows, 3))
    assert [(f.code, f.where) for f in found][:1] == [("nonfinite-parameter", "w")]
    assert "not finite on rank 2 (rank 2: 0 NaN, 4 Inf in the local piece); ranks 0 and 1 are finite" \
        in found[0].message


@pytest.mark.parametrize("factor", [8.0, 12.5])
def test_the_factor_is_compared_with_the_per_element_ratio(factor):
    # RMS 1, 1, 10 on 8/8/4 elements: 10x; named at factor 8, not at 12.5
    rows = [_row("w", [1.0, 1.0, 10.0], [8, 8, 4])]
    far = [w for c, w in _found(_record(rows, 3), far_factor=factor) if c == "gradient-far-off"]
    assert far == (["rank 2"] if factor == 8.0 else [])
