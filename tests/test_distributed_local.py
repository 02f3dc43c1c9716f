"""DTensor helpers in one process: lazy import of torch.distributed.tensor, FSDP2 units left as found."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from inspector.distributed.tensors import is_dtensor


def test_analyses_do_not_import_torch_distributed_tensor():
    code = ("import sys, inspector.offsets, inspector.capture, inspector.placement, inspector.report\n"
            "print(sorted(m for m in sys.modules if m.startswith(('torch.distributed.tensor', "
            "'torch.distributed.fsdp'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


@pytest.fixture
def world1(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


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
    from inspector.models import LoadedModel
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
