"""Wrappers (DDP, FSDP) are seen through to the model underneath."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import inspector
from inspector import LoadedModel, load_model
from inspector.distributed import process_group

# tiny-gpt2: wte (32, 16) is lm_head
TIE = ("transformer.wte.weight", "lm_head.weight")


@pytest.mark.collectives
def test_ddp_and_fsdp_wrappers(tiny_gpt2):
    from torch.distributed.fsdp import FullyShardedDataParallel

    with process_group():  # a gloo world of one
        ddp = nn.parallel.DistributedDataParallel(tiny_gpt2)
        seen = LoadedModel(ddp, "ddp", "test")  # a wrapped model is loaded as the model underneath
        assert seen.wrappers == ("DistributedDataParallel",) and seen.model is tiny_gpt2
        assert [f.code for f in seen.findings] == ["model-wrapped"] and "(without 'module.')" in \
            seen.findings[0].message
        assert [g.names for g in inspector.alias_groups(ddp)] == [TIE]
        assert inspector.compare_ties(inspector.snapshot_ties(tiny_gpt2), torch.compile(ddp)) == []
        other = load_model("sample:tiny-gpt2").model
        fsdp = FullyShardedDataParallel(other, device_id=torch.device("cpu"), use_orig_params=True)
        assert next(n for n, _ in fsdp.named_parameters()).startswith("_fsdp_wrapped_module.")
        assert inspector.offset_map(fsdp)["name"].iloc[0] == "transformer.wte.weight"
        assert [g.names for g in inspector.alias_groups(fsdp)] == [TIE]
        assert [f.code for f in LoadedModel(fsdp, "fsdp", "test").findings] == ["model-wrapped"]
        flat = FullyShardedDataParallel(load_model("sample:tiny-gpt2").model, device_id=torch.device("cpu"))
        assert [(f.code, f.where) for f in LoadedModel(flat, "flat", "test").findings] == \
            [("model-wrapped", ""), ("fsdp-flat-parameters", "_flat_param")]


def test_a_plain_model_is_its_own_underlying_model(tiny_gpt2):
    loaded = LoadedModel(tiny_gpt2, "tiny", "test")
    assert loaded.model is tiny_gpt2 and loaded.wrappers == () and loaded.findings == []
