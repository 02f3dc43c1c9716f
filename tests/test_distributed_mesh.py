"""check_step, placement_table and captures on 2-D meshes, DDP, planted faults and out-of-step ranks.

The 2-rank results come from the ``world2`` run (tests/distributed_worker.py, then
tests/distributed_checks.py); the 2 x 2 mesh from ``world4``. References are computed on the
ranks independently: ``full_tensor()`` of every gradient, unsharded modules, planted bits.
"""

from __future__ import annotations

import pytest


def _checks(world2) -> list[dict]:
    _, ranks = world2
    return [r["checks"] for r in ranks]


def _mesh_case(res: dict, world: int, dp: int) -> None:
    assert "error" not in res, res.get("trace")
    # the global norm counts each element once, however many tensor-parallel copies hold it
    assert res["check_total"] == pytest.approx(res["reference"], rel=1e-6)
    assert res["report_total"] == pytest.approx(res["reference"], rel=1e-6)
    assert res["check_rows"] == pytest.approx(res["reference_rows"], rel=1e-6)
    assert res["findings"] == []
    # norm.weight: 8 float32 sharded on dp only: 32 / dp bytes on every one of the world's ranks
    assert res["bytes_per_rank"]["norm.weight"] == {str(r): 32 // dp for r in range(world)}
    # up.weight (16, 8) split over dp and tp: 512 / world bytes each
    assert res["bytes_per_rank"]["up.weight"] == {str(r): 512 // world for r in range(world)}
    # the tp copies of a dp-only parameter share a key (the dp coordinate); up.weight has no copies
    tp = world // dp
    assert res["keys"]["norm.weight"] == [r // tp for r in range(world)]
    assert res["keys"]["up.weight"] == [-1] * world
    drift = [f for f in res["drift"] if f[0] == "replica-drift"]
    assert [f[2] for f in drift] == ["norm.weight"]
    last = world - 1
    assert f"should be identical on ranks {last - 1} and {last} but at step 1" in drift[0][3]


def test_fsdp_over_tensor_parallel_on_a_1x2_mesh_is_exact(world2):
    for res in _checks(world2):
        _mesh_case(res["mesh_1x2"], 2, 1)


def test_fsdp_over_tensor_parallel_on_a_2x2_mesh_is_exact(world4):
    for res in world4:
        _mesh_case(res["mesh_2x2"], 4, 2)


def test_ddp_broadcast_buffers_is_not_a_drift(world2):
    for res in _checks(world2):
        kept = res["ddp_bn"]["True"]
        assert {(f[0], f[1]) for f in kept["first"]} == {("replica-resynchronised", "info")}
        assert {f[2] for f in kept["first"]} == {"1.running_mean", "1.running_var"}
        assert "copies rank 0's buffers to every rank" in kept["first"][0][3]
        assert kept["after_forward"] == []  # the next forward pass did copy them
        off = res["ddp_bn"]["False"]
        assert {(f[0], f[1], f[2]) for f in off["first"]} == {("replica-drift", "error", "1.running_mean"),
                                                              ("replica-drift", "error", "1.running_var")}
        assert {f[0] for f in off["after_forward"]} == {"replica-drift"}
    r0, r1 = (res["ddp_bn"] for res in _checks(world2))
    assert r0["True"]["mean"] == r1["True"]["mean"] and r0["False"]["mean"] != r1["False"]["mean"]


def test_a_nonfinite_shard_and_a_nonfinite_loss_are_traced_to_their_rank(world2):
    for res in _checks(world2):
        found = res["nonfinite"]["inf_shard"]
        assert res["nonfinite"]["inf_shard_grad_nonfinite"] > 2  # NaN reached every gradient
        values = [f for f in found if f[0] == "nonfinite-parameter"]
        assert [(f[2], f[1]) for f in values] == [("blocks.0.fc1.weight", "error")]
        assert (
            "not finite on rank 1 (rank 1: 0 NaN, 1 Inf in the local piece); rank 0 is finite" in values[0][3]
        )
        grads = [f for f in found if f[0] == "nonfinite-gradient"]
        assert len(grads) == 1  # one finding, not one per tensor and rank
        assert "start at rank 1's piece of parameter blocks.0.fc1.weight" in grads[0][3]
        loss = [f for f in res["nonfinite"]["nan_loss"] if f[0] == "nonfinite-gradient"]
        assert len(loss) == 1 and "start at the loss of rank 1, which is not finite" in loss[0][3]


def test_gradients_far_off_with_two_ranks_have_no_majority(world2):
    for res in _checks(world2):
        far = [f for f in res["far_off"]["findings"] if f[0] == "gradient-far-off"]
        assert [f[2] for f in far] == ["ranks 0 and 1"]
        r0, r1 = res["far_off"]["rms"]  # each rank's RMS per element, measured on its pieces
        assert r0 / r1 > 10
        assert f"rank 0's gradients are {r0 / r1:.3g}x larger per element than rank 1's" in far[0][3]
        assert "With 2 ranks there is no majority" in far[0][3]


def test_swapped_elements_and_ulp_pairs_are_found_within_the_stated_calls(world2):
    for res in _checks(world2):
        calls = res["hash"]["calls"]
        assert len(calls) == res["hash"]["parts"] == 128  # the bound docs/distributed.md states
        assert all("small" in c for c in calls)  # 6 elements: read whole every call
        assert sum("big" in c for c in calls) == 1  # 40,000 elements: the swapped part, once per PARTS calls


def test_build_report_on_fsdp2_skips_conversions_and_says_so(world2):
    for res in _checks(world2):
        sections = res["report"]["sections"]
        assert {sid: s for sid, (s, _) in sections.items() if s == "error"} == {}
        assert "conversion checks skipped: the parameters are DTensors" in sections["aliases"][1]
        assert res["report"]["deepcopy"].startswith("skipped: the parameters are DTensors")


def test_tensor_parallel_captures_say_which_piece_they_hold(world2):
    for rank, res in enumerate(_checks(world2)):
        cap = res["capture"]
        assert cap["shapes"]["up"] == [3, 8] and cap["shapes"]["down"] == [3, 8]
        assert (
            cap["placements"]["up"] == f"piece of rank {rank} (mesh coordinate [{rank}]) of a DTensor placed "
            "Shard(1) on mesh [2]"
        )
        assert cap["placements"]["down"].startswith("whole output")
        assert cap["piece_matches"] and cap["down_matches"]
        assert [f[:2] for f in cap["findings"]] == [["capture-shard", "up"]]
        assert cap["hooks"][0] == cap["hooks"][1]


def test_a_skipped_check_names_the_rank_behind_instead_of_hanging(world2):
    r0, r1 = (res["skipped"] for res in _checks(world2))
    assert r0["step0"] == r1["step0"] == 0
    assert r1["step1"] == "skipped"
    assert "rank 1 did not reach it within 1 s (rank 1 made" in r0["step1"]["error"]
    assert "No collective was started" in r0["step1"]["error"]
    assert "rank 1, at the later step, skipped a call at an earlier step" in r1["step2"]["error"]


def test_a_model_error_on_one_rank_names_the_rank(world2):
    r0, r1 = (res["failing"]["error"] for res in _checks(world2))
    assert r1["error"].startswith(
        "InspectorError: rank 1: the model's forward pass or loss raised at step 0: "
        "ValueError: shapes (2, 4) and (3, 3) do not match"
    )
    assert "rank 1 did not reach it within 1 s" in r0["error"]
