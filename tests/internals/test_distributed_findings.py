"""check_step's findings from step records, and check_step itself in a world of one process."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from inspector.distributed import check_step, read_run
from inspector.distributed.check import local_step
from inspector.distributed.findings import step_findings
from inspector.runfiles.record import PER_RANK, PER_TENSOR
from inspector.sharding.findings import ranks_of
from inspector.utils.findings import InspectorError
from inspector.watching import parse_run_bytes


def _row(name, local_norms, local_numel, placements="Shard(0)", kind="parameter", nan=None, keys=None,
         hashes=None):
    world = len(local_norms)
    return {"name": name, "kind": kind, "placements": placements, "local_grad_norm": local_norms,
            "local_numel": local_numel, "nan": nan or [0] * world, "inf": [0] * world,
            "replica_key": keys or [-1] * world, "hash": hashes or [[0, 0]] * world}


def _record(rows, world=2):
    return {"step": 7, "world_size": world, "tensors": rows}


def test_a_rank_far_off_the_others_is_named():
    # RMS per element: rank 0 sqrt(1/100) = 0.1, rank 1 0.1, rank 2 sqrt(400/100) = 2.0 -> 20x the median
    rows = [_row("w", [1.0, 1.0, 20.0], [100, 100, 100])]
    found = step_findings(_record(rows, world=3))
    assert [(f.code, f.where) for f in found] == [("gradient-far-off", "rank 2")]
    assert "20x larger per element" in found[0].message
    assert step_findings(_record(rows, world=3), far_factor=25.0) == []


def test_uneven_shards_are_an_imbalance():
    # a (3, 4) weight on 2 ranks: torch.chunk gives 2 rows (8 elements) and 1 row (4); with a
    # 10-element bias split 5/5, rank 0 holds 13 and rank 1 holds 9: mean 11, +18.2%
    rows = [_row("w", [1.0, 1.0], [8, 4]), _row("b", [1.0, 1.0], [5, 5])]
    found = step_findings(_record(rows))
    assert [(f.code, f.where) for f in found] == [("shard-imbalance", "rank 0")]
    assert "rank 0 holds 13 sharded parameter elements, 18.2% above the mean of 11" in found[0].message
    assert "w (8/4)" in found[0].message


def test_a_plain_parameter_whose_gradient_differs_is_not_synchronised():
    rows = [_row("head.weight", [3.0, 3.5], [6, 6], placements="", keys=[0, 0])]
    found = step_findings(_record(rows))
    assert [(f.code, f.where) for f in found] == [("gradient-not-synchronized", "head.weight")]
    assert "from 3 to 3.5 across ranks" in found[0].message


def test_drift_names_the_minority_ranks():
    # four ranks hold a replicated buffer; ranks 1 and 3 agree with rank 0 except rank 2
    rows = [_row("bn.running_mean", [None] * 4, [4] * 4, placements="", kind="buffer", keys=[0] * 4,
                 hashes=[[5, 1], [5, 1], [6, 1], [5, 1]])]
    found = step_findings(_record(rows, world=4))
    assert [(f.code, f.where) for f in found] == [("replica-drift", "bn.running_mean")]
    assert (
        "identical on ranks 0, 1, 2 and 3 but at step 7 rank 2 holds different values from ranks 0, 1 and 3"
        in found[0].message
    )


def test_check_step_in_one_process_writes_a_row_per_step(tmp_path):
    # Linear(2, 1) on ones(1, 2), loss = output sum: weight grad (1, 1), bias grad 1 -> norm sqrt(3)
    model = nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    path = tmp_path / "run.inspect"
    first = check_step(model, 0, path)
    model.bias.grad[0] = math.inf
    second = check_step(model, 1, path)
    assert first.record["global"]["grad_norm"] == pytest.approx(math.sqrt(3))
    assert first.ok and (first.rank, first.world_size) == (0, 1)
    assert [(f.code, f.where) for f in second.findings] == [("nonfinite-gradient", "bias")]
    assert path.read_bytes()[:4] == b"\xff\xff\xff\xff"  # the Arrow run file the watch writes
    run = read_run(path)
    assert run.totals["grad_norm"].tolist()[0] == pytest.approx(math.sqrt(3))
    assert math.isinf(run.totals["grad_norm"].tolist()[1])  # Arrow keeps the Inf (JSON wrote null)
    assert run.per_rank["nonfinite"].tolist() == [0, 1]
    assert [(f.step, f.code) for f in run.findings] == [(1, "nonfinite-gradient")]
    assert run.tensors_at(1)["inf"].tolist() == [[0], [1]]  # per tensor and rank, as the JSON line held it
    assert run.check_run is not None and run.check_run.checks[1].tensors[1].inf == [1]


def append_record(path, record: dict) -> None:
    """One record as one JSON line, NaN and Inf as null: how older versions wrote ``check_step``'s file."""
    def finite(value):
        if isinstance(value, float):
            return value if math.isfinite(value) else None
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, list):
            return [finite(v) for v in value]
        return value

    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(finite(record), allow_nan=False, default=str, separators=(",", ":")) + "\n")


def test_the_json_lines_of_older_versions_still_read(tmp_path):
    model = nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    path = tmp_path / "run.jsonl"
    for step in range(2):
        append_record(path, check_step(model, step, path=None).record)
    assert len(path.read_text().splitlines()) == 2
    arrow = tmp_path / "run.inspect"
    for step in range(2):
        check_step(model, step, arrow)
    old, new = read_run(path), read_run(arrow)
    assert old.kind == new.kind == "check"
    assert old.totals["grad_norm"].tolist() == pytest.approx(new.totals["grad_norm"].tolist())
    same = ["step", "rank", "grad_norm", "nonfinite", "param_numel", "param_bytes", "grad_bytes"]
    assert old.per_rank[same].equals(new.per_rank[same])


def test_check_step_refuses_to_append_to_a_file_of_another_kind(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text("not a run\n")
    model = nn.Linear(2, 1)
    with pytest.raises(InspectorError, match="is not a check_step run file of this version"):
        check_step(model, 0, path)
    assert path.read_text() == "not a run\n"


def test_a_line_that_is_not_a_record_is_named():
    record = ('{"format": "inspector-distributed", "step": 0, "world_size": 1, "ranks": [], '
              '"tensors": [], "global": {}}')
    with pytest.raises(InspectorError, match="run.jsonl line 2 is not JSON"):
        parse_run_bytes((record + "\n{oops\n" + record).encode(), "run.jsonl")
    with pytest.raises(InspectorError, match=r"x.jsonl is empty \(blank lines only\)"):
        parse_run_bytes(b"\n", "x.jsonl")


@pytest.mark.collectives
@pytest.mark.parametrize("shard", ["fsdp", "ddp", "none"])
def test_command_runs_as_one_process_without_torchrun(tmp_path, shard, capsys):
    import torch.distributed as dist

    from inspector.__main__ import main

    out = tmp_path / "run.jsonl"
    assert main(["distributed", "sample_models/fsdp.py:build", "--shard", shard, "--steps", "2",
                 "-o", str(out)]) == 0
    assert not dist.is_initialized()  # the group it made is gone
    run = read_run(out)
    assert (run.world_size, run.backend, run.totals["step"].tolist()) == (1, "gloo", [0, 1])
    assert run.per_rank["param_numel"].tolist() == [18282, 18282]
    placements = set(run.tensors.loc[run.tensors["kind"] == "parameter", "placements"])
    assert placements == ({"Shard(0)"} if shard == "fsdp" else {""})
    assert "step 1: grad norm" in capsys.readouterr().out


@pytest.mark.collectives
def test_command_refuses_bad_input_with_exit_2(tmp_path, capsys):
    from inspector.__main__ import main

    assert (
        main(["distributed", "sample_models/fsdp.py:build", "--steps", "0", "-o", str(tmp_path / "r")]) == 2
    )
    assert "argument --steps: must be a whole number of at least 1, got 0" in capsys.readouterr().err
    assert main(["distributed", "sample:llama-70b-meta", "-o", str(tmp_path / "r")]) == 2
    assert "meta device" in capsys.readouterr().err


@pytest.mark.collectives
def test_fsdp_sample_is_the_file_model_and_runs_by_name(tmp_path):
    from inspector.__main__ import main
    from sample_models import SAMPLES

    assert "fsdp-mlp" in SAMPLES and not SAMPLES["fsdp-mlp"].meta_only
    by_name, by_file = tmp_path / "name.jsonl", tmp_path / "file.jsonl"
    assert (
        main(["distributed", "sample:fsdp-mlp", "--shard", "none", "--steps", "1", "-o", str(by_name)]) == 0
    )
    assert main(["distributed", "sample_models/fsdp.py:build", "--shard", "none", "--steps", "1",
                 "-o", str(by_file)]) == 0
    # the same seeded weights and batch: the same gradient norm, bit for bit
    name_run, file_run = read_run(by_name), read_run(by_file)
    assert name_run.totals["grad_norm"].tolist() == file_run.totals["grad_norm"].tolist()
    assert name_run.per_rank["param_numel"].tolist() == [18282]


def test_a_rank_far_below_the_others_is_named_too():
    # RMS per element: ranks 0 and 2 sqrt(100/100) = 1, rank 1 (gradients x 0.01) 0.01 ->
    # 100x below the median 1
    rows = [_row("w", [10.0, 0.1, 10.0], [100, 100, 100])]
    found = step_findings(_record(rows, world=3))
    assert [(f.code, f.where) for f in found] == [("gradient-far-off", "rank 1")]
    assert (
        "rank 1's gradients are 100x smaller per element than the median of the 3 ranks" in found[0].message
    )


def test_with_two_ranks_far_off_names_both_and_says_there_is_no_majority():
    rows = [_row("w", [10.0, 0.1], [100, 100])]
    found = step_findings(_record(rows))
    assert [(f.code, f.where) for f in found] == [("gradient-far-off", "ranks 0 and 1")]
    assert "100x larger per element than rank 1's" in found[0].message
    assert "With 2 ranks there is no majority" in found[0].message


def test_nonfinite_gradients_in_many_tensors_are_one_finding_naming_the_origin():
    rows = [_row(n, [None, None], [4, 4], nan=[4, 4]) for n in ("a", "b", "c", "d")]
    rows[2]["value_nan"], rows[2]["value_inf"] = [0, 0], [0, 1]  # rank 1's piece of c holds an Inf
    found = step_findings(_record(rows))
    assert [(f.code, f.where) for f in found] == [("nonfinite-parameter", "c"), ("nonfinite-gradient", "a")]
    assert (
        "the gradients of 4 tensors are not finite on ranks 0 and 1 (a, b, c and 1 more)" in found[1].message
    )
    assert "start at rank 1's piece of parameter c" in found[1].message


def test_hash_sees_swaps_and_ulp_pairs_and_depends_on_position_only():
    from inspector.distributed.digest import PARTS, WHOLE, hashes, prepare, run, schedule

    a = torch.linspace(-3.0, 3.0, 101)
    swapped = a.clone()
    swapped[[10, 12]] = swapped[[12, 10]]          # same parity: a sum of every other element misses it
    ulp = a.clone()
    bits = ulp.view(torch.int32)
    bits[20] += 1
    bits[21] -= 1                                   # the sum of the bits misses it
    h = hashes([(a, 0), (swapped, 0), (ulp, 0), (a.clone(), 0), (a[50:], 50)]).tolist()
    assert h[0] == h[3] and len({h[0], h[1], h[2]}) == 3
    # a part hashed alone equals the same part hashed among others: the position is the tensor's
    assert hashes([(a[50:], 50)]).tolist() == [h[4]]
    # many pieces at once (positions from one ramp), kept positions: the same hashes as one by one
    many = [(a[k:k + 7], k) for k in range(70)]
    one_by_one = [hashes([p]).item() for p in many]
    assert hashes(many).tolist() == one_by_one
    assert run(prepare(many, keep=True), len(many), a.device).tolist() == one_by_one
    # the windows cover every local element of the large tensors exactly once over PARTS calls,
    # the small ones are read whole by every call, and a call touches only the tensors of its window
    numels, lengths = [WHOLE * 3 + 7, 10, WHOLE * 50, WHOLE + 1], [WHOLE + 3, 10, WHOLE * 25, WHOLE + 1]
    assert schedule(numels, lengths, None) == [(1, 0, 10)]
    seen = {i: [] for i in (0, 2, 3)}
    for call in range(PARTS):
        spans = schedule(numels, lengths, call)
        assert spans == schedule(numels, lengths, call + PARTS) and len(spans) <= 2
        for i, start, end in spans:
            seen[i].append((start, end))
    for i, spans in seen.items():
        spans.sort()
        assert spans[0][0] == 0 and spans[-1][1] == lengths[i]
        assert all(x[1] == y[0] for x, y in zip(spans, spans[1:], strict=False))


@pytest.mark.parametrize("mode", ["fsdp", "ddp"])
def test_what_check_step_keeps_between_steps_does_not_keep_the_model_alive(world1, mode):
    import gc
    import weakref

    from inspector.distributed.train import shard
    from sample_models.fsdp import build, example_inputs, loss

    model = shard(build(), mode, torch.device("cpu"))
    x = example_inputs(2)
    loss(model(x), x).backward()
    first = check_step(model, 0, path=None).record["global"]["grad_norm"]
    assert (
        check_step(model, 1, path=None).record["global"]["grad_norm"] == first
    )  # the kept plan: same numbers
    ref = weakref.ref(model)
    del model
    gc.collect()
    assert ref() is None


def _gathered(model, world, seed):
    """Every rank's numbers of one call, made up: healthy, then a few planted anomalies."""
    from inspector.distributed.columns import Gathered
    from inspector.distributed.plan import plan_for

    plan = plan_for(model, world)
    n = len(plan.tensors)
    g = torch.Generator().manual_seed(seed)
    per_tensor = torch.zeros(world, n, 8, dtype=torch.float64)
    sq = torch.rand(n, generator=g, dtype=torch.float64) * torch.tensor(plan.is_param, dtype=torch.float64)
    per_tensor[:, :, 0] = sq
    per_tensor[:, :, 3] = torch.tensor(plan.numels, dtype=torch.float64)
    per_tensor[:, :, 4] = torch.tensor(plan.is_param, dtype=torch.float64)
    per_tensor[:, :, 5] = plan.columns["keys"]
    hashes = torch.randint(-2**62, 2**62, (1, n, 2), generator=g).expand(world, n, 2).clone()
    for _ in range(int(torch.randint(0, 4, (1,), generator=g))):
        r, i, what = (int(torch.randint(0, m, (1,), generator=g)) for m in (world, n, 5))
        if what == 0:
            hashes[r, i, 0] += 1                       # a replica drifts
        elif what == 1:
            per_tensor[r, i, 1] = 3.0                  # NaN in a gradient
            per_tensor[r, i, 0] = math.nan
        elif what == 2:
            per_tensor[r, i, 6] = 2.0                  # NaN in the values
        elif what == 3:
            per_tensor[r, i, 0] *= 1.5                 # a gradient not averaged
        else:
            per_tensor[r, :, 0] *= 400.0               # a rank far off
    per_rank = torch.zeros(world, 9, dtype=torch.float64)
    return Gathered(plan, per_tensor, per_rank, hashes, plan.columns["holders"], 3, world, "gloo", "")


def test_the_columnar_findings_are_those_of_the_record():
    from inspector.distributed.columns import column_findings

    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2), nn.Linear(2, 2))
    fired = set()
    for seed in range(60):
        world = 2 + seed % 3
        found = column_findings(_gathered(model, world, seed))
        again = _gathered(model, world, seed)
        assert found == step_findings(again.record()), seed
        fired |= {f.code for f in found}
    assert {"replica-drift", "nonfinite-gradient", "nonfinite-parameter", "gradient-not-synchronized",
            "gradient-far-off"} <= fired


def test_a_step_check_pickles_with_its_record():
    import pickle

    m = nn.Linear(2, 1)
    m(torch.ones(1, 2)).sum().backward()
    check = check_step(m, 4, path=None)
    back = pickle.loads(pickle.dumps(check))
    assert back.record == check.record and back.step == 4 and back.findings == check.findings
    assert back.record["tensors"][0]["name"] == "weight"


# ----------------------------------------------------------------------------------------------------
# Every per-rank statistic of a distributed step on uneven shards: each rank's own element count.
# FSDP splits dimension 0 with ``torch.chunk``: a (5, 4) weight on 3 ranks is 2 + 2 + 1 rows (8, 8 and 4
# elements), a (3, 4) weight on 2 ranks is 2 + 1 rows (8 and 4). A rank's gradient RMS per element divides
# its own squared norm by its own count; with rank 0's count for every rank, a far-off rank is hidden
# and a healthy one is named.


def _uneven_row(name, per_element, local_numel, placements="Shard(0)", nan=None, inf=None):
    """A sharded parameter whose every local gradient element is ``per_element[rank]``."""
    world = len(local_numel)
    norms = [g * math.sqrt(n) for g, n in zip(per_element, local_numel, strict=True)]
    return {"name": name, "kind": "parameter", "placements": placements, "local_grad_norm": norms,
            "local_numel": local_numel, "nan": nan or [0] * world, "inf": inf or [0] * world,
            "replica_key": [-1] * world, "hash": [[0, 0]] * world}


def _uneven_record(rows, world):
    return {"step": 3, "world_size": world, "tensors": rows}


def _codes(record, **kw):
    return [(f.code, f.where) for f in step_findings(record, **kw)]


def test_the_same_gradient_per_element_on_uneven_shards_is_not_far_off():
    # weight (5, 4): 8/8/4 elements, bias (5,): 2/2/1; every element's gradient 0.5 on every rank:
    # each rank's RMS is 0.5 whatever it holds. The shards themselves are uneven: 10/10/5, mean 8.33,
    # rank 0 +20.0%
    rows = [_uneven_row("w", [0.5] * 3, [8, 8, 4]), _uneven_row("b", [0.5] * 3, [2, 2, 1])]
    found = step_findings(_uneven_record(rows, 3))
    assert [(f.code, f.where) for f in found] == [("shard-imbalance", "rank 0")]
    assert "rank 0 holds 10 sharded parameter elements, 20.0% above the mean of 8 (per rank: 10, 10, 5)" \
        in found[0].message
    assert "w (8/8/4), b (2/2/1)" in found[0].message


def test_a_rank_far_above_on_a_smaller_shard_is_named_with_its_own_count():
    # per element 1, 1 and 12 on 8/8/4 elements: RMS 1, 1, 12 -> 12x the median. Counting 8 elements
    # on rank 2 would give sqrt(144 * 4 / 8) = 8.49: under the factor 10, not named
    rows = [_uneven_row("w", [1.0, 1.0, 12.0], [8, 8, 4])]
    found = [f for f in step_findings(_uneven_record(rows, 3)) if f.code == "gradient-far-off"]
    assert [f.where for f in found] == ["rank 2"]
    assert "rank 2's gradients are 12x larger per element than the median of the 3 ranks (RMS 12 against 1)" \
        in found[0].message


def test_a_healthy_rank_on_a_smaller_shard_is_not_named():
    # per element 1, 1 and 0.12 on 8/8/4 elements: 8.33x below the median, inside the factor 10.
    # Counting 8 elements on rank 2 would give sqrt(0.0144 * 4 / 8) = 0.0849: 11.8x, a false finding
    rows = [_uneven_row("w", [1.0, 1.0, 0.12], [8, 8, 4])]
    assert _codes(_uneven_record(rows, 3)) == [("shard-imbalance", "rank 0")]


def test_two_ranks_on_uneven_shards_compare_per_element():
    # (3, 4) weight on 2 ranks: 8 and 4 elements; per element 1 and 12 -> 12x, named.
    # With 8 elements on rank 1 it would be 8.49x and silent
    rows = [_uneven_row("w", [1.0, 12.0], [8, 4])]
    found = [f for f in step_findings(_uneven_record(rows, 2)) if f.code == "gradient-far-off"]
    assert [f.where for f in found] == ["ranks 0 and 1"]
    assert "rank 1's gradients are 12x larger per element than rank 0's (RMS 12 against 1)" \
        in found[0].message
    healthy = _uneven_record([_uneven_row("w", [1.0, 9.0], [8, 4])], 2)  # 9x: under the factor
    assert _codes(healthy) == [("shard-imbalance", "rank 0")]


def test_a_rank_whose_larger_shard_holds_the_same_norm_is_far_below():
    # the imbalance the other way: rank 0 holds 12 elements of a (9, 4) weight's 4 ranks (3/3/3/0 rows),
    # rank 3 none (no RMS); the same squared norm over 12 elements on ranks 0-2 and a 100x smaller one
    # per element on rank 1
    rows = [_uneven_row("w", [1.0, 0.01, 1.0, 0.0], [12, 12, 12, 0])]
    found = step_findings(_uneven_record(rows, 4), far_factor=10.0)
    far = [f for f in found if f.code == "gradient-far-off"]
    assert [f.where for f in far] == ["rank 1"]
    assert "100x smaller per element than the median of the 3 ranks (RMS 0.01 against 1)" in far[0].message
    imbalance = [f for f in found if f.code == "shard-imbalance"]
    assert "rank 0 holds 12 sharded parameter elements, 33.3% above the mean of 9 (per rank: 12, 12, 12, 0)" \
        in imbalance[0].message


def test_non_finite_pieces_of_uneven_shards_are_counted_per_rank():
    # rank 2's single row of w holds 4 Inf in its values; the other ranks' 8 elements are finite
    rows = [_uneven_row("w", [1.0, 1.0, 1.0], [8, 8, 4])]
    rows[0]["value_nan"], rows[0]["value_inf"] = [0, 0, 0], [0, 0, 4]
    found = step_findings(_uneven_record(rows, 3))
    assert [(f.code, f.where) for f in found][:1] == [("nonfinite-parameter", "w")]
    assert "not finite on rank 2 (rank 2: 0 NaN, 4 Inf in the local piece); ranks 0 and 1 are finite" \
        in found[0].message


@pytest.mark.parametrize("factor", [8.0, 12.5])
def test_the_factor_is_compared_with_the_per_element_ratio(factor):
    # RMS 1, 1, 10 on 8/8/4 elements: 10x; named at factor 8, not at 12.5
    rows = [_uneven_row("w", [1.0, 1.0, 10.0], [8, 8, 4])]
    far = [w for c, w in _codes(_uneven_record(rows, 3), far_factor=factor) if c == "gradient-far-off"]
    assert far == (["rank 2"] if factor == 8.0 else [])


# ----------------------------------------------------------------------------------------------------
# Where non-finite gradients started: the ranks the one spread finding is about, first the one at fault.


def _spread(value_nan=None, value_inf=None, losses=None):
    """Two tensors whose gradients are NaN on both ranks, with ``value_*`` on the first and the ranks'
    ``loss_finite`` flags; the one ``nonfinite-gradient`` finding."""
    from inspector.sharding.findings import ranks_of

    rows = [_row(n, [None, None], [4, 4], nan=[4, 4]) for n in ("a", "b")]
    if value_nan is not None:
        rows[0]["value_nan"], rows[0]["value_inf"] = value_nan, value_inf
    record = _record(rows)
    if losses is not None:
        record["ranks"] = [{"rank": r, "loss_finite": v} for r, v in enumerate(losses)]
    [f] = [f for f in step_findings(record) if f.code == "nonfinite-gradient"]
    return f, ranks_of(f)


def test_the_spread_is_about_the_rank_whose_values_went_non_finite():
    # rank 0's piece of a holds a NaN, rank 1's an Inf: both are where it started
    f, ranks = _spread(value_nan=[1, 0], value_inf=[0, 1])
    assert ranks == (0, 1) and "They start at ranks 0 and 1's piece of parameter a" in f.message
    f, ranks = _spread(value_nan=[0, 0], value_inf=[0, 2])
    assert ranks == (1,) and "They start at rank 1's piece of parameter a" in f.message


def test_the_spread_is_about_the_rank_whose_loss_went_non_finite():
    f, ranks = _spread(losses=[True, False])
    assert ranks == (1,)
    assert "They start at the loss of rank 1, which is not finite while the other ranks' is" in f.message


def test_a_loss_non_finite_everywhere_names_no_rank_at_fault():
    f, ranks = _spread(losses=[False, False])
    assert ranks == (0, 1)  # every rank whose gradients hold NaN: none is singled out
    assert "The loss is not finite on every rank: look at the model's forward pass and the batches" \
        in f.message
    f, ranks = _spread(losses=[True, True])
    assert ranks == (0, 1)
    assert "Every rank's values and loss are finite: the backward pass made them" in f.message
    f, ranks = _spread()
    assert ranks == (0, 1) and "pass loss= to check_step to name the rank" in f.message


def test_a_plain_parameter_not_synchronised_says_what_to_do():
    rows = [_row("head.weight", [3.0, 3.5], [6, 6], placements="", keys=[0, 0])]
    [f] = step_findings(_record(rows))
    assert f.message.endswith("its gradients are not averaged, so the replicas will drift apart. Shard it "
                              "with fully_shard, wrap the model in DDP, or all-reduce its gradient.")


# ----------------------------------------------------------------------------------------------------
# Replicas: which ranks must agree, and the buffers DDP copies from rank 0 at the next forward pass.


def _buffer(keys, hashes, resync=None):
    row = _row("bn.running_mean", [None] * len(keys), [4] * len(keys), placements="", kind="buffer",
               keys=keys, hashes=hashes)
    row["local_grad_norm"] = []  # a buffer has no gradient
    if resync:
        row["resync"] = resync
    return row


def test_a_buffer_ddp_copies_from_rank_0_is_resynchronised_not_a_drift():
    rows = [_buffer([0] * 4, [[5, 1], [5, 1], [6, 1], [5, 1]], resync="buffers")]
    [f] = step_findings(_record(rows, world=4))
    assert (f.code, f.severity, f.where) == ("replica-resynchronised", "info", "bn.running_mean")
    assert f.message == (
        "buffer bn.running_mean differs between ranks 0, 1, 2 and 3 at step 7 (each rank updated it in its "
        "own forward pass, as BatchNorm does with its running statistics). "
        "DistributedDataParallel(broadcast_buffers=True) copies rank 0's buffers to every rank at the start "
        "of the next forward pass, so the copies are re-synchronised: not a drift.")


def test_a_replica_group_without_rank_0_is_not_resynchronised():
    # ranks 1, 2 and 3 hold one replica (rank 0 another key): DDP's copy from rank 0 does not reach them;
    # rank 2 is the odd one of the three, so the copy to keep is the majority's (rank 1's), not rank 0's
    rows = [_buffer([3, 0, 0, 0], [[1, 1], [5, 1], [6, 1], [5, 1]], resync="buffers")]
    [f] = step_findings(_record(rows, world=4))
    assert (f.code, f.where) == ("replica-drift", "bn.running_mean")
    assert f.message == (
        "buffer bn.running_mean should be identical on ranks 1, 2 and 3 but at step 7 rank 2 holds different "
        "values from ranks 1 and 3. Something updated it on one rank only (an unsynchronised buffer such as "
        "BatchNorm running statistics, a parameter outside FSDP/DDP, a rank-dependent seed or in-place "
        "edit); broadcast it from rank 1 (of the majority) or shard/wrap it.")
    assert list(ranks_of(f)) == [2]


def test_two_copies_that_differ_name_both_ranks_and_what_tells_them_apart():
    # 2 ranks, rank 0's copy drifted: nothing in two hashes says which one is wrong, so copying rank 0's
    # (the old advice) could spread the bad one
    rows = [_row("w", [1.0, 1.0], [4, 4], placements="", keys=[0, 0], hashes=[[9, 1], [5, 1]])]
    [f] = [f for f in step_findings(_record(rows)) if f.code == "replica-drift"]
    assert f.message.startswith(
        "parameter w should be identical on ranks 0 and 1 but at step 7 ranks 0 and 1 hold different values, "
        "2 versions with no majority: nothing here tells which copy is wrong")
    assert "broadcast it from rank 0" not in f.message
    for check in ("last checkpoint", "optimizer state", "third replica"):
        assert check in f.message
    assert list(ranks_of(f)) == [0, 1]  # about both
    # a copy holding NaN where the other is finite is the wrong one: that tells them apart
    rows[0]["value_nan"], rows[0]["value_inf"] = [0, 3], [0, 0]
    [f] = [f for f in step_findings(_record(rows)) if f.code == "replica-drift"]
    assert ("at step 7 rank 1 holds different values from rank 0, and NaN/Inf where rank 0 is finite: the "
            "non-finite copy is the wrong one") in f.message
    assert f.message.endswith("broadcast it from rank 0 or shard/wrap it.") and list(ranks_of(f)) == [1]
    # a tie of two against two is no majority either
    rows = [_row("w", [1.0] * 4, [4] * 4, placements="", keys=[0] * 4,
                 hashes=[[9, 1], [5, 1], [9, 1], [5, 1]])]
    [f] = [f for f in step_findings(_record(rows, world=4)) if f.code == "replica-drift"]
    assert "ranks 0, 1, 2 and 3 hold different values, 2 versions with no majority" in f.message


def test_each_replica_group_is_compared_within_itself():
    # ranks 0, 1 hold one replica and 2, 3 another (two pipeline stages): each pair agrees inside; the
    # second group's pair disagrees in a second tensor
    agree = _buffer([0, 0, 1, 1], [[5, 1], [5, 1], [6, 1], [6, 1]])
    assert step_findings(_record([agree], world=4)) == []
    split = _buffer([0, 0, 1, 1], [[5, 1], [5, 1], [6, 1], [7, 1]])
    split["name"] = "other"
    found = step_findings(_record([agree, split], world=4))
    assert [(f.code, f.where) for f in found] == [("replica-drift", "other")]
    # a tie of one against one: no copy is taken as the right one
    assert "should be identical on ranks 2 and 3 but at step 7 ranks 2 and 3 hold different values" \
        in found[0].message
    # three ranks of which two differ from the majority: "hold"
    many = _buffer([0] * 5, [[5, 1], [6, 1], [5, 1], [7, 1], [5, 1]])
    [f] = step_findings(_record([many], world=5))
    assert "at step 7 ranks 1 and 3 hold different values from ranks 0, 2 and 4" in f.message


def test_non_finite_values_on_one_of_two_ranks_say_the_other_is_finite():
    rows = [_row("w", [1.0, 1.0], [4, 4])]
    rows[0]["value_nan"], rows[0]["value_inf"] = [2, 0], [1, 0]
    [f] = [f for f in step_findings(_record(rows)) if f.code == "nonfinite-parameter"]
    assert f.message == (
        "the values of parameter w (not its gradient) are not finite on rank 0 (rank 0: 2 NaN, 1 Inf in the "
        "local piece); rank 1 is finite. Every forward pass now spreads it to the outputs and gradients of "
        "every rank: look for what wrote it (an optimizer step on a non-finite gradient, an in-place edit, a "
        "checkpoint load).")
    rows[0]["value_nan"], rows[0]["value_inf"] = [2, 0], [0, 3]
    [f] = [f for f in step_findings(_record(rows)) if f.code == "nonfinite-parameter"]
    assert "not finite on ranks 0 and 1 (rank 0: 2 NaN, 0 Inf; rank 1: 0 NaN, 3 Inf in the local piece). " \
        in f.message


def test_three_tensors_are_named_without_more():
    rows = [_row(n, [None, None], [4, 4], nan=[4, 4]) for n in ("a", "b", "c")]
    [f] = step_findings(_record(rows))
    assert "the gradients of 3 tensors are not finite on ranks 0 and 1 (a, b, c): non-finite" in f.message


def test_a_sharded_buffer_is_no_imbalance_and_a_row_without_gradients_is_left_out():
    # a buffer split 8/4 is not a parameter: no imbalance; its empty gradient list takes no part in the RMS
    buffer = _row("stats", [1.0, 1.0], [8, 4], kind="buffer")
    buffer["local_grad_norm"] = []
    rows = [buffer, _row("w", [1.0, 20.0], [4, 4])]  # 20x: far off
    found = step_findings(_record(rows))
    assert [(f.code, f.where) for f in found] == [("gradient-far-off", "ranks 0 and 1")]


# -- the check's local numbers from gradients a caller already read (the watch's): the same numbers as when
# the check reads them itself, in any order of names, read afresh where the names leave a parameter out

class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(5, 3)
        self.mid = nn.Linear(3, 3)
        self.frozen = nn.Linear(3, 3)
        self.head = nn.Linear(3, 5, bias=False)
        self.head.weight = self.emb.weight
        self.frozen.requires_grad_(False)
        self.register_buffer("scale", torch.tensor([2.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(self.mid(self.emb(x))) * self.scale)


def _same(a, b) -> bool:
    """The per-tensor numbers and hashes of two local steps are equal (the per-rank memory read moves)."""
    n = len(a.plan.tensors) * PER_TENSOR
    tail = n + PER_RANK
    return torch.equal(a.packed[:n], b.packed[:n]) and torch.equal(a.packed[tail:], b.packed[tail:])


def _model() -> _Tied:
    torch.manual_seed(0)
    m = _Tied()
    m(torch.tensor([[0, 1, 4]])).pow(2).sum().backward()
    return m


@pytest.mark.parametrize("order", ["as named", "reversed"])
def test_given_gradients_give_the_numbers_the_check_reads_itself(order):
    m = _model()
    names = [n for n, _ in m.named_parameters()]
    if order == "reversed":
        names = names[::-1]
    params = dict(m.named_parameters())
    grads = [params[n].grad for n in names]
    norms = torch.stack([g.norm() if g is not None else torch.zeros(()) for g in grads]).double()
    read = local_step(m, 3, grad_norms=(names, norms))
    given = local_step(m, 3, grad_norms=(names, norms), grads=grads)
    assert _same(read, given)
    # the frozen layer has no gradient: its column says so (what a wrong pick would get wrong)
    plan_names = [name for name, _, _ in given.plan.tensors]
    stats = given.packed[: len(plan_names) * PER_TENSOR].reshape(len(plan_names), PER_TENSOR)
    assert stats[plan_names.index("frozen.weight"), 4] == 0.0
    assert stats[plan_names.index("mid.weight"), 4] == 1.0


def test_given_gradients_in_another_order_than_named_are_not_taken_by_position():
    m = _model()
    names = [n for n, _ in m.named_parameters()]
    norms = torch.zeros(len(names), dtype=torch.float64)
    shuffled = [p.grad for _, p in m.named_parameters()][::-1]  # the wrong order for these names
    right = local_step(m, 0, grad_norms=(names, norms), grads=[p.grad for _, p in m.named_parameters()])
    wrong = local_step(m, 0, grad_norms=(names, norms), grads=shuffled)
    assert not _same(right, wrong)  # the given list is what is read


def test_names_that_leave_a_parameter_out_read_the_gradients_afresh():
    m = _model()
    names = [n for n, _ in m.named_parameters()][1:]  # one parameter left out
    params = dict(m.named_parameters())
    grads = [None for _ in names]  # would say "no gradient" everywhere if it were taken
    norms = torch.stack([params[n].grad.norm() if params[n].grad is not None else torch.zeros(())
                         for n in names]).double()
    given = local_step(m, 0, grad_norms=(names, norms), grads=grads)
    read = local_step(m, 0, grad_norms=(names, norms))
    assert _same(read, given)


def test_one_parameter_is_taken_as_a_list_of_one():
    torch.manual_seed(0)
    m = nn.Linear(2, 1, bias=False)
    m(torch.ones(1, 2)).sum().backward()
    norms = m.weight.grad.norm().reshape(1).double()
    given = local_step(m, 0, grad_norms=(["weight"], norms), grads=[m.weight.grad])
    read = local_step(m, 0, grad_norms=(["weight"], norms))
    assert _same(read, given)
    assert not _same(read, local_step(m, 0, grad_norms=(["weight"], norms), grads=[None]))
