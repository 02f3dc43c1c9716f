"""DTensor helpers in one process: lazy import of torch.distributed.tensor, FSDP2 units left as found."""

from __future__ import annotations

import math
import subprocess
import sys

import torch

from inspector.distributed import is_dtensor


def test_analyses_do_not_import_torch_distributed_tensor():
    code = ("import sys, inspector.offsets, inspector.capture, inspector.placement, inspector.report\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch.distributed.tensor', "
            "'torch.distributed.fsdp'))))")
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"


def _sharded_sample():
    from torch.distributed.fsdp import fully_shard

    from sample_models.fsdp import build

    torch.manual_seed(0)
    model = build()
    for unit in model.fsdp_units():
        fully_shard(unit)
    fully_shard(model)
    return model


def test_inspecting_between_forward_and_backward_keeps_gathered_units_gathered(world1):
    import inspector
    from sample_models.fsdp import example_inputs, loss

    model = _sharded_sample()
    x = example_inputs(2)
    # a fresh model is sharded everywhere, and an inspection leaves it so
    inspector.capture_activations(model, x)
    assert is_dtensor(model.stem.weight) and is_dtensor(model.blocks[0].fc1.weight)
    # the user's forward: FSDP2 keeps the root unit (stem, norm, head) gathered for the backward
    outputs = model(x)
    assert not is_dtensor(model.stem.weight) and is_dtensor(model.blocks[0].fc1.weight)
    inspector.capture_activations(model, x)
    assert not is_dtensor(model.stem.weight)  # still gathered, as the user left it
    assert is_dtensor(model.blocks[0].fc1.weight)  # sharded before, sharded after
    loss(outputs, x).backward()
    assert model.stem.weight.grad is not None and is_dtensor(model.stem.weight)


def test_report_placement_section_shows_bytes_per_rank_and_mesh_dimension(world1):
    from inspector import LoadedModel
    from inspector.report import build_report
    from sample_models.fsdp import example_inputs, loss

    model = _sharded_sample()
    loaded = LoadedModel(model, "fsdp", "sample_models/fsdp.py:build", inputs_fn=example_inputs, loss_fn=loss)
    section = build_report(loaded, ["placement"]).section("placement")
    tables = {t.title: t for t in section.tables}
    # 18 parameters, 18,282 float32 elements, all Shard(0) on a mesh of one rank: 73,128 bytes on rank 0
    per_rank = tables["Bytes of DTensor parameters and buffers per rank (from their placements)"]
    assert per_rank.columns == ("rank", "bytes", "sharded_bytes", "replicated_bytes")
    assert per_rank.rows == ((0, 73128, 73128, 0),)
    per_dim = tables["Bytes this rank holds per mesh dimension and placement"]
    assert per_dim.rows == (("(1,)", 0, 1, "Shard(0)", 18, 73128),)


def test_check_step_global_norm_is_nan_like_clip_grad_norm_when_a_gradient_holds_nan():
    from torch import nn

    from inspector.distributed import check_step

    # weight grad (1, 1), bias grad 1: norm sqrt(3); a NaN in the weight's gradient makes it NaN
    model = nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    model.weight.grad[0, 0] = float("nan")
    result = check_step(model, 0, None)
    assert [(f.code, f.where) for f in result.findings] == [("nonfinite-gradient", "weight")]
    assert math.isnan(result.record["global"]["grad_norm"])
    assert math.isnan(float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf)))


def test_check_step_global_norm_is_unknown_for_a_partial_gradient(world1):
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, distribute_tensor

    from inspector.distributed import check_step
    from inspector.offsets import gradient_report

    mesh = init_device_mesh("cpu", (1,))
    model = nn.Module()
    model.w = nn.Parameter(distribute_tensor(torch.ones(2), mesh, [Replicate()]))
    model.b = nn.Parameter(distribute_tensor(torch.ones(1), mesh, [Replicate()]))
    model.w.grad = DTensor.from_local(torch.tensor([3.0, 4.0]), mesh, [Partial()])  # a pending sum
    model.b.grad = DTensor.from_local(torch.tensor([12.0]), mesh, [Replicate()])
    record = check_step(model, 0, None).record
    assert math.isnan(record["global"]["grad_norm"])
    assert {r["name"]: r["grad_norm"] for r in record["tensors"]} == {"w": None, "b": 12.0}
    assert gradient_report(model).total_norm == 13.0  # reduced first: sqrt(25 + 144)
