"""FSDP2 and DTensor on a world of 2 gloo processes on the CPU, started once per test session.

tests/distributed_worker.py runs on each rank (the ``world2`` fixture in conftest.py starts it):
the ``distributed`` command as torchrun would run it, then the analyses on an FSDP2 model and a
tensor-parallel model, with a NaN and two drifts planted on rank 1. Sizes of
sample_models/fsdp.py:build (see its docstring): 18282
parameters, every sharded dimension even, so each rank holds 9141.
"""

from __future__ import annotations

import json
import math

import pytest

from inspector.distributed import read_run


def _rows(rows: list[list], key: int = 0) -> dict:
    return {r[key]: r for r in rows}


def test_command_writes_one_merged_line_per_step(world2):
    out, ranks = world2
    assert [r["cli"] for r in ranks] == [{"rc": 0, "initialised_after": False}] * 2
    run = read_run(out / "run.jsonl")
    assert run.world_size == 2 and run.backend == "gloo" and run.kind == "check"
    assert run.totals["step"].tolist() == [0, 1, 2]
    assert run.steps[["step", "rank"]].values.tolist() == [[s, r] for s in range(3) for r in range(2)]
    assert run.per_rank["param_numel"].tolist() == [9141] * 6
    assert run.per_rank["param_bytes"].tolist() == [9141 * 4] * 6
    assert run.findings == []
    # global norm from the two ranks' pieces: sqrt(r0^2 + r1^2)
    first = run.per_rank[run.per_rank["step"] == 0]["grad_norm"].tolist()
    assert run.totals["grad_norm"].iloc[0] == pytest.approx(math.hypot(*first), rel=1e-12)


def test_global_gradient_norm_equals_clip_grad_norm(world2):
    _, ranks = world2
    for res in (ranks[0]["fsdp"], ranks[1]["fsdp"]):
        assert res["report_total"] == pytest.approx(res["clip_total"], rel=1e-6)
        assert res["check_total"] == pytest.approx(res["clip_total"], rel=1e-6)
        assert res["module_names"][0] == "(model)" and res["module_norms"][0] == res["report_total"]
        # explicit DTensor gradients: the same pass, the same numbers
        assert res["explicit_total"] == res["report_total"]
        assert res["explicit_local"] == [row[2] for row in res["report_rows"]]
        assert res["fc1_total"] == pytest.approx(res["fc1_direct"], rel=1e-6)
        assert res["fc1_total"] < res["report_total"]
        assert res["explicit_local_piece"]["error"].startswith(
            "InspectorError: the gradient given for stem.weight has shape (16, 32), but the parameter has "
            "shape (32, 32) (the parameter is a DTensor")
        rows = _rows(res["report_rows"])
        assert res["norms_twice"] == [[rows["stem.weight"][1], rows["stem.bias"][1]], [res["report_total"]]]
        local = {row[0]: row[2] for row in res["report_rows"]}
        assert local == pytest.approx(res["local_norms_direct"], rel=1e-6)
    # the global per-parameter norms agree between ranks, the local ones do not
    r0, r1 = (_rows(r["fsdp"]["report_rows"]) for r in ranks)
    assert r0["stem.weight"][1] == r1["stem.weight"][1]
    assert r0["stem.weight"][2] != r1["stem.weight"][2]
    assert math.hypot(r0["stem.weight"][2], r1["stem.weight"][2]) == pytest.approx(r0["stem.weight"][1])
    for res in (ranks[0]["tp"], ranks[1]["tp"]):
        assert res["report_total"] == pytest.approx(res["clip_total"], rel=1e-6)


def test_offset_map_has_global_and_local_offsets(world2):
    _, ranks = world2
    # stem.weight (32, 32) Shard(0): 16 rows = 512 elements per rank; stem.bias 16 of 32
    for rank, res in enumerate(r["fsdp"] for r in ranks):
        table = _rows(res["offsets"])
        assert table["stem.weight"] == [
            "stem.weight",
            0,
            1024,
            1024,
            0,
            512,
            512,
            512 * rank,
            512 * rank + 512,
            "Shard(0)",
            [2],
        ]
        assert table["stem.bias"][1:9] == [1024, 1056, 32, 512, 528, 16, 1024 + 16 * rank, 1040 + 16 * rank]
        assert res["offsets"][-1][5] == 9141  # local vector end
    # RowwiseParallel's weight (4, 6) is Shard(1): each rank holds 3 columns, not one range
    for rank, res in enumerate(r["tp"] for r in ranks):
        table = _rows(res["offsets"])
        assert table["up.weight"] == ["up.weight", 24, 12, 12 * rank, 12 * rank + 12, "Shard(0)"]
        assert table["down.weight"] == ["down.weight", 24, 12, 30 + 3 * rank, -1, "Shard(1)"]
        assert table["down.bias"][2:] == [4, 54, 58, "Replicate()"]


def test_placement_aliases_capture_and_report_accept_dtensors(world2):
    _, ranks = world2
    for res in (ranks[0]["fsdp"], ranks[1]["fsdp"]):
        assert res["aliases"] == []
        placement = _rows(res["placement"])
        # stem.weight: 16 rows x 32 x 4 bytes = 2048 bytes on each rank
        assert placement["stem.weight"][1:] == ["Shard(0)", "2048", "{0: 2048, 1: 2048}"]
        assert placement["scale"][1:] == ["", "128", "{}"]
        # every parameter is Shard(0) over the 2 ranks: 9141 elements x 4 bytes = 36564 bytes each;
        # the buffer scale is a plain tensor, not placed on a mesh
        assert res["rank_bytes"]["ranks"] == [[0, 36564, 36564, 0], [1, 36564, 36564, 0]]
        assert res["rank_bytes"]["mesh_dims"] == [["(2,)", 0, 2, "Shard(0)", 18, 36564]]
        assert res["capture"]["still_dtensor"] is True
        assert "blocks.0.fc1" in res["capture"]["outputs"]
        assert {sid: status for sid, (status, _) in res["report"].items()
                if status == "error"} == {}


def test_planted_nan_is_named_by_rank(world2):
    _, ranks = world2
    for res in (ranks[0]["fsdp"], ranks[1]["fsdp"]):
        nan = [f for f in res["nan_findings"] if f["code"] == "nonfinite-gradient"]
        assert [f["where"] for f in nan] == ["blocks.0.fc1.weight"]
        assert "not finite on rank 1 (rank 1: 1 NaN, 0 Inf" in nan[0]["message"]
        assert "rank 0 is finite" in nan[0]["message"]
        states = _rows(res["nan_report"])
        assert states["blocks.0.fc1.weight"][1:] == ["nonfinite", [1]]
        assert states["stem.weight"][1:] == ["ok", []]


def test_planted_drift_names_tensor_and_ranks(world2):
    out, ranks = world2
    for res in (ranks[0]["fsdp"], ranks[1]["fsdp"]):
        drift = [f for f in res["drift_findings"] if f["code"] == "replica-drift"]
        assert [f["where"] for f in drift] == ["scale"]
        assert (  # two copies: no majority, so neither is taken as the right one
            "should be identical on ranks 0 and 1 but at step 2 ranks 0 and 1 hold different values"
            in drift[0]["message"]
        )
    for res in (ranks[0]["tp"], ranks[1]["tp"]):
        assert [(f["code"], f["where"]) for f in res["drift_findings"]] == [("replica-drift", "down.bias")]
    planted = read_run(out / "planted.jsonl")
    assert [(f.step, f.code, f.where) for f in planted.findings] == [
        (1, "nonfinite-gradient", "blocks.0.fc1.weight"), (2, "replica-drift", "scale")]
    assert planted.per_rank.set_index(["step", "rank"])["nonfinite"].to_dict() == {
        (1, 0): 0, (1, 1): 1, (2, 0): 0, (2, 1): 0}


@pytest.mark.parametrize("fmt", ["json", "md", "html"])
def test_report_of_a_run_file_has_a_section_per_rank(world2, tmp_path, fmt):
    import jsonschema

    from inspector.__main__ import main
    from inspector.report import load_schema

    out, _ = world2
    target = tmp_path / f"run.{fmt}"
    assert main(["report", str(out / "planted.jsonl"), "-o", str(target)]) == 0
    text = target.read_text(encoding="utf-8")
    if fmt == "json":
        data = json.loads(text)
        jsonschema.validate(data, load_schema())
        assert [s["id"] for s in data["sections"]] == ["findings", "run", "rank-0", "rank-1", "tensors"]
        assert [(f["code"], f["where"]) for f in data["findings"]] == [
            ("nonfinite-gradient", "blocks.0.fc1.weight"), ("replica-drift", "scale")]
        rank1 = data["sections"][3]
        assert rank1["facts"]["nonfinite_gradient_values"] == 1
        # two ranks whose buffer differs: no majority says which is right, so both are named
        assert rank1["tables"][1]["rows"] == [[1, "blocks.0.fc1.weight", "nonfinite gradient"],
                                              [2, "scale", "replicas disagree, no majority"]]
        assert data["sections"][2]["tables"][1]["rows"] == [[2, "scale", "replicas disagree, no majority"]]
    elif fmt == "md":
        assert "## Rank 0" in text and "## Rank 1" in text
        assert "| 2 | scale | replicas disagree, no majority |" in text
    else:
        assert 'id="section-rank-1"' in text and "Gradient norm per rank" in text


def test_strided_shard_sizes_and_unknown_ranges(world2):
    # FSDP2 over tensor parallel: _StridedShard(0, split_factor=2) of an (8, 2) float32 tensor on 2 ranks:
    # 4 rows each (rank 0 rows 0, 1, 4, 5), 8 elements, 32 bytes, in two blocks (no one range)
    _, ranks = world2
    for rank, res in enumerate(r["strided"] for r in ranks):
        assert res["local_rows"] == ([0, 1, 4, 5] if rank == 0 else [2, 3, 6, 7])
        assert res["offsets"] == [["w", 16, 8, -1, -1]]
        assert res["bytes_per_rank"] == {"0": 32, "1": 32}
        assert res["local_bytes"] == 32 and res["sharded"]
        assert res["rank_bytes"] == [[0, 32, 32, 0], [1, 32, 32, 0]]
        assert res["grad_total"] == pytest.approx(math.sqrt(sum(i * i for i in range(16))))  # sqrt(1240)
