"""Device maps of saved Hugging Face models: a layer stays whole, the plan runs under accelerate.

DistilBERT (16896 bytes) and RoBERTa (17920) tie their output projection to the word
embedding; the projection has a bias of its own (RoBERTa's is also ``lm_head.bias``).
"""

from __future__ import annotations

import pytest
import torch

from inspector import load_model
from inspector.__main__ import main
from inspector.placement import (
    check_with_accelerate,
    compare_with_accelerate,
    dispatch_plan,
    plan_device_map_explained,
)

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

#: Budgets (GPUs need not exist: planning is arithmetic) under which the tie pulls the tied
#: projection away from where the walk put it, worked out by the planner's records.
GPU_BUDGETS = {"distilbert": "0=6KiB,1=6KiB,cpu=20KiB", "roberta": "0=2KiB,1=8KiB,cpu=20KiB"}


@pytest.fixture(scope="module")
def models(hf_folders):
    return {f: load_model(f"hf:{hf_folders[f]}") for f in ("distilbert", "roberta")}


def devices_by_module(plan):
    table = plan.audit
    return table.groupby("module")["device"].agg(lambda d: set(map(str, d)))


@pytest.mark.parametrize("family", ["distilbert", "roberta"])
def test_a_tied_layer_moves_whole(models, family):
    model = models[family].model
    plan = plan_device_map_explained(model, GPU_BUDGETS[family])
    moved = {(r.step, r.subject) for r in plan.records if r.step in ("tie", "together")}
    head = "vocab_projector" if family == "distilbert" else "lm_head.decoder"
    assert ("tie", f"{head}.weight") in moved and ("together", f"{head}.bias") in moved or \
        ("tie", f"{head}.bias") in moved  # RoBERTa's bias is itself lm_head.bias, so a tie moves it
    assert all(len(d) == 1 for d in devices_by_module(plan)), devices_by_module(plan)
    assert plan.device_map[head] == plan.device_map[next(k for k in plan.device_map if "embeddings" in k)]
    assert check_with_accelerate(model, plan.device_map) is None
    assert not [f for f in plan.findings if f.severity != "info"]


def test_the_plan_runs_dispatched_on_cpu_and_disk(models):
    # cpu 8 KiB: the word embedding stays, the rest goes to disk; the projection tied to it comes
    # back to the cpu, and its bias with it (the layer is never split)
    loaded = models["distilbert"]
    plan = plan_device_map_explained(loaded.model, "cpu=8KiB,disk=1GiB")
    assert plan.device_map["vocab_projector"] == "cpu" and "disk" in plan.device_map.values()
    inputs = loaded.example_inputs(2)
    with torch.no_grad():
        expected = loaded.model(**inputs).logits
    with dispatch_plan(loaded.model, plan.device_map) as d, torch.no_grad():
        got = d.model(**inputs).logits
        assert set(d.table.groupby("module")["device"].nunique()) == {1}
    assert torch.equal(got, expected)


@pytest.mark.filterwarnings("ignore:The following device_map keys")
def test_the_plan_dispatches_on_meta(models):
    # the GPU plan's devices stood in by the meta device: accelerate accepts the map and places
    # every module's tensors on one device
    from accelerate import dispatch_model

    model = load_model(f"hf:{models['roberta'].source.removeprefix('hf:')}", device="meta").model
    plan = plan_device_map_explained(model, GPU_BUDGETS["roberta"])
    meta_map = {k: "meta" if isinstance(d, int) else "cpu" for k, d in plan.device_map.items()}
    dispatch_model(model, device_map=meta_map, main_device="meta")
    for name, module in model.named_modules():
        own = {t.device.type for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]}
        assert len(own) <= 1, name


def test_compare_when_accelerate_cannot_plan(models, hf_folders, capsys):
    # accelerate 1.15's get_module_size_with_ties raises IndexError on this budget
    budget = "0=1KiB,1=8KiB,cpu=2KiB,disk=100MiB"
    comparison = compare_with_accelerate(models["roberta"].model, budget)
    assert comparison.accelerate_error.startswith("IndexError") and comparison.accelerate_map == {}
    assert [f.code for f in comparison.accelerate_findings] == ["accelerate-failed"]
    assert (
        main(["devicemap", f"hf:{hf_folders['roberta']}", "--max-memory", budget, "--compare-accelerate"])
        == 0
    )
    out = capsys.readouterr().out
    assert "lm_head.decoder: 1" in out and "accelerate could not plan this model" in out


DISPATCHED = '''
import os

import torch
from torch import nn
from accelerate import dispatch_model


def build():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
    offload = os.path.join(os.path.dirname(__file__), "offload")  # beside this file: in the test's folder
    return dispatch_model(m, device_map={"0": "cpu", "1": "cpu", "2": "disk"}, offload_dir=offload)


def example_inputs(batch_size):
    return torch.randn(batch_size, 4, generator=torch.Generator().manual_seed(1))


def loss(outputs, inputs):
    return outputs.square().mean()
'''


def test_an_accelerate_dispatched_factory_runs(tmp_path, monkeypatch, capsys):
    (tmp_path / "dispatched.py").write_text(DISPATCHED)
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    source = f"{tmp_path / 'dispatched.py'}:build"
    loaded = load_model(source)  # weights offloaded to disk are not "meta, structure only"
    assert not loaded.is_meta and loaded.model[2].weight.device.type == "meta"
    assert "accelerate-offloaded" in {f.code for f in loaded.findings}
    for argv in (["offsets", source, "--backward"], ["attribute", source, "--steps", "2"]):
        assert main(argv) == 0, capsys.readouterr().err[-1500:]


@pytest.mark.cuda
def test_the_plan_runs_dispatched_on_a_gpu(models):
    # GPU 0 8 KiB: the word embedding and the projection tied to it (weight and bias) on GPU 0,
    # the rest on disk, run from GPU 0; the outputs equal the undispatched model's
    loaded = models["distilbert"]
    plan = plan_device_map_explained(loaded.model, "0=10KiB,cpu=8KiB,disk=1GiB")
    assert plan.device_map["vocab_projector"] == 0
    inputs = loaded.example_inputs(2)
    with torch.no_grad():
        expected = loaded.model(**inputs).logits
    with dispatch_plan(loaded.model, plan.device_map) as d, torch.no_grad():
        got = d.model(**{k: v.to("cuda:0") for k, v in inputs.items()}).logits
        assert set(d.table.groupby("module")["device"].nunique()) == {1}
    torch.testing.assert_close(got.cpu(), expected, rtol=1e-4, atol=1e-5)


def test_the_device_map_page_says_when_accelerate_cannot_plan(hf_folders):
    from apptest import run_page

    source = f"hf:{hf_folders['roberta']}"
    at = run_page("3_Device_map.py", source, timeout=120)
    at.session_state[f"dm_budget_{source}"] = {  # the budget of the test above, in place of the suggested one
        "edited_rows": {0: {"device": "0", "budget": "1KiB"}, 1: {"device": "1", "budget": "8KiB"},
                        2: {"device": "cpu", "budget": "2KiB"}},
        "added_rows": [{"device": "disk", "budget": "100MiB"}], "deleted_rows": []}
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    warned = " ".join(w.value for w in at.warning)
    assert "accelerate could not plan this model" in warned and "IndexError" in warned
    assert not any("place every tensor alike" in s.value for s in at.success)
