"""Wrapped models (torch.compile, DDP, FSDP) are inspected as the model underneath."""

from __future__ import annotations

import pytest
import torch

import inspector
from inspector import LoadedModel, load_model
from inspector.__main__ import main
from inspector.aliases import overwrite_on_conversion

# tiny-gpt2: wte (32, 16) is lm_head; 4080 unique parameter elements, 4592 counting the tie twice.
TIE = ("transformer.wte.weight", "lm_head.weight")


def test_compiled_model_names_and_ties_are_the_models(tiny_gpt2):
    compiled = torch.compile(tiny_gpt2)
    assert [n for n, _ in compiled.named_parameters()][0] == "_orig_mod.transformer.wte.weight"
    assert [g.names for g in inspector.alias_groups(compiled)] == [TIE]
    assert inspector.compare_ties(inspector.snapshot_ties(tiny_gpt2), compiled) == []
    table = inspector.offset_map(compiled)
    assert table["name"].iloc[0] == "transformer.wte.weight" and int(table["end"].iloc[-1]) == 4080
    assert inspector.model_summary(compiled).parameter_elements_with_aliases == 4592
    assert inspector.gradient_norms(compiled)["name"].iloc[0] == "transformer.wte.weight"
    assert not inspector.placement_table(compiled)["name"].str.startswith("_orig_mod").any()
    plan = inspector.plan_device_map(compiled, {"cpu": 10**9})
    assert not any(k.startswith("_orig_mod") for k in plan)


def test_retie_through_the_compiled_wrapper(tiny_gpt2):
    compiled = torch.compile(tiny_gpt2)
    snap = inspector.snapshot_ties(compiled)
    with overwrite_on_conversion(True):
        compiled.to(torch.float64)  # two objects, two storages
    assert [f.code for f in inspector.compare_ties(snap, compiled)] == ["tie-broken"]
    assert tiny_gpt2.lm_head.weight is not tiny_gpt2.transformer.wte.weight
    inspector.retie(compiled, snap)
    assert tiny_gpt2.lm_head.weight is tiny_gpt2.transformer.wte.weight
    assert inspector.compare_ties(snap, compiled) == []


def test_captures_name_the_modules_as_written(tiny_gpt2):
    ids = torch.randint(0, 32, (1, 4), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        caps = inspector.capture_activations(torch.compile(tiny_gpt2), ids, modules=["lm_head"])
    assert list(caps.outputs) == ["lm_head"]
    assert caps.outputs["lm_head"].shape == (1, 4, 32)


def test_loaded_model_unwraps_once_and_says_so(tiny_gpt2):
    loaded = LoadedModel(torch.compile(tiny_gpt2), "tiny", "test")
    assert loaded.model is tiny_gpt2 and loaded.wrappers == ("OptimizedModule",)
    assert [(f.code, f.severity) for f in loaded.findings] == [("model-wrapped", "info")]
    assert "_orig_mod." in loaded.findings[0].message


COMPILED_FILE = '''
import torch
from sample_models import get_sample


def build():
    return torch.compile(get_sample("tiny-gpt2").build())


def example_inputs(batch_size):
    return torch.randint(0, 32, (batch_size, 4), generator=torch.Generator().manual_seed(0))
'''


def test_cli_on_a_compiled_model_from_a_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "compiled.py").write_text(COMPILED_FILE)
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    assert main(["aliases", f"{tmp_path / 'compiled.py'}:build"]) == 0
    out = capsys.readouterr().out
    assert "transformer.wte.weight, lm_head.weight" in out and "_orig_mod" not in out.split("findings")[0]
    assert "model-wrapped" in out
    assert main(["capture", f"{tmp_path / 'compiled.py'}:build", "--modules", "lm_head"]) == 0
    assert "_orig_mod" not in capsys.readouterr().out.split("findings")[0]


def test_checkpoint_saved_from_a_wrapped_model_loads(tiny_gpt2, tmp_path):
    with torch.no_grad():
        tiny_gpt2.transformer.wte.weight.fill_(0.5)
    torch.save(torch.compile(tiny_gpt2).state_dict(), tmp_path / "compiled.pt")  # keys: _orig_mod.*
    loaded = load_model("sample:tiny-gpt2", checkpoint=tmp_path / "compiled.pt")
    assert [f.code for f in loaded.findings] == ["checkpoint-wrapped"]
    assert torch.equal(loaded.model.lm_head.weight, torch.full((32, 16), 0.5))
    assert loaded.model.lm_head.weight is loaded.model.transformer.wte.weight


def test_home_and_alias_pages_on_a_compiled_model(tmp_path, monkeypatch):
    from apptest import run_page

    (tmp_path / "compiled.py").write_text(COMPILED_FILE)
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    source = f"{tmp_path / 'compiled.py'}:build"
    home = run_page("../app.py", source)
    frames = [df.value for df in home.dataframe]
    assert any("model-wrapped" in set(f.get("code", [])) for f in frames)
    names = next(f["name"] for f in frames if "same_as" in f)  # every parameter and buffer name
    assert names.iloc[0] == "transformer.wte.weight" and not names.str.contains("_orig_mod").any()
    aliases = run_page("1_Alias_graph.py", source)
    shown = "\n".join(df.value.to_string() for df in aliases.dataframe)
    assert "transformer.wte.weight" in shown and "_orig_mod." not in shown


@pytest.mark.collectives
def test_distributed_records_name_tensors_as_written(tmp_path, capsys):
    from inspector.distributed import read_run

    names = {}
    for shard in ("ddp", "none"):
        out = tmp_path / f"{shard}.jsonl"
        assert main(["distributed", "sample_models/fsdp.py:build", "--shard", shard, "--steps", "1",
                     "-o", str(out)]) == 0
        names[shard] = list(read_run(out).tensors["name"])
    assert names["ddp"] == names["none"] and not any(n.startswith("module.") for n in names["ddp"])
