"""Real architectures end to end: saved with ``save_pretrained``, loaded through ``hf:``, run
through every command and every page; the inspected weights are the saved ones."""

from __future__ import annotations

import json

import pytest
import torch
from apptest import PAGES, run_page
from hf_folders import ARCHITECTURES, FAMILIES, SAVED_CLASS
from safetensors.torch import load_file

from inspector.__main__ import main
from inspector.loading.hf import choose_class, class_findings
from inspector.loading.hf_saved import saved_form
from inspector.loading.models import load_model
from inspector.utils.findings import InspectorError

pytest.importorskip("transformers")

COMMANDS = {  # the smallest inputs each command takes
    "summary": [],
    "aliases": ["--convert", "to-float64-overwrite", "--retie"],
    "offsets": ["--backward", "--locate", "0"],
    "devicemap": ["--max-memory", "0=8KB,cpu=1GB"],
    "capture": ["--batch-size", "1"],
    "attribute": ["--target", "1", "--steps", "2"],
    # the report page builds every section for every architecture; here the command itself
    "report": ["--format", "json", "--sections", "summary", "aliases"],
}


#: Views that cannot apply, and the reason the command gives (exit 2); every other pair exits 0.
CANNOT = {("t5-bare", "attribute"): "model without a head", ("t5-bare", "offsets"): "defines no loss"}


def assert_saved_weights(model: torch.nn.Module, folder) -> None:
    """Every saved tensor equals the model's, under the names save_pretrained writes."""
    saved = load_file(str(folder / "model.safetensors"))
    mine = saved_form(model, model.state_dict())
    assert set(saved) <= set(mine), sorted(set(saved) - set(mine))
    for key, value in saved.items():
        assert torch.equal(mine[key], value), key


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_loads_the_saved_class_and_weights(hf_folders, arch):
    loaded = load_model(f"hf:{hf_folders[arch]}")
    assert type(loaded.model).__name__ == SAVED_CLASS[arch]
    assert [(f.code, f.severity) for f in loaded.findings] == [("hf-class", "info")]
    assert_saved_weights(loaded.model, hf_folders[arch])
    inputs = loaded.example_inputs(2)
    with torch.no_grad():
        out = loaded.model(**inputs)
    if loaded.has_loss:
        assert torch.isfinite(loaded.loss(out, inputs))


def test_ties_are_the_saved_ones(hf_folders):
    llama = load_model(f"hf:{hf_folders['llama-tied']}").model
    assert llama.lm_head.weight is llama.model.embed_tokens.weight
    llama = load_model(f"hf:{hf_folders['llama-untied']}").model
    assert llama.lm_head.weight is not llama.model.embed_tokens.weight
    bart = load_model(f"hf:{hf_folders['bart']}").model  # one shared table: encoder, decoder and head
    shared = bart.model.shared.weight
    assert (
        bart.model.encoder.embed_tokens.weight is shared and bart.model.decoder.embed_tokens.weight is shared
    )
    assert bart.lm_head.weight is shared


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_command(hf_folders, arch, command, capsys, tmp_path):
    argv = [command, f"hf:{hf_folders[arch]}", *COMMANDS[command]]
    if command == "report":
        argv += ["-o", str(tmp_path / "r.json")]
    code = main(argv)
    out, err = capsys.readouterr()
    reason = CANNOT.get((arch, command))
    assert code == (2 if reason else 0), (code, err[-2000:])
    if reason:
        last = err.strip().splitlines()[-1]
        assert last.startswith("error: ") and reason in last, err[-2000:]
    if command == "report":
        report = json.loads((tmp_path / "r.json").read_text())
        failed = {s["id"]: s.get("note") for s in report["sections"] if s["status"] == "error"}
        assert not failed, failed
    elif code == 0:
        assert out.startswith("model: ") or "device map" in out, out[:500]


def _page_files() -> list[str]:
    return ["../app.py", *sorted(p.name for p in PAGES.glob("*.py"))]


ACTIONS = {  # the button each page computes with, after setting its smallest inputs
    "1_Alias_graph.py": ("aliases_check", {}),
    "2_Flatten_map.py": ("offsets_backward", {}),
    "5_Attributions.py": ("attr_compute", {"attr_steps": 4}),
}


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_every_page(hf_folders, arch):
    from ui.models import Selection, get_loaded

    source = f"hf:{hf_folders[arch]}"
    for page in _page_files():
        at = run_page(page, source, timeout=120)
        errors = [e.value for e in at.error]
        assert all(e.strip() for e in errors), page
        if page == "../app.py":
            assert "hf-class" in "\n".join(df.value.to_string() for df in at.dataframe)
        key, values = ACTIONS.get(page, (None, {}))
        if key is not None and not errors and at.button(key=key).disabled:
            assert at.info, (page, "a disabled action says why")  # e.g. no loss: no backward pass
        elif key is not None and not errors:
            for widget, value in values.items():
                at.slider(key=widget).set_value(value)
            at.button(key=key).click().run()
            assert not at.exception, (page, [e.value for e in at.exception])
        if page == "6_Report.py":
            at.number_input[0].set_value(1)  # batch size
            at.number_input[1].set_value(2)  # attribution steps
            at.button[0].click().run()
            assert not at.exception, [e.value for e in at.exception]
            assert not at.error, (page, [e.value for e in at.error])
        assert all(e.value.strip() for e in at.error), page
    loaded = get_loaded(Selection(source=source))
    assert_saved_weights(loaded.model, hf_folders[arch])  # the pages inspected the saved weights, unchanged


def _copy(folder, to, architectures):
    to.mkdir()
    for f in folder.iterdir():
        (to / f.name).write_bytes(f.read_bytes())
    config = json.loads((to / "config.json").read_text())
    if architectures is None:
        config.pop("architectures", None)
    else:
        config["architectures"] = architectures
    (to / "config.json").write_text(json.dumps(config))
    return to


def test_home_page_shows_a_model_that_is_not_the_saved_one(hf_folders, tmp_path):
    # The folder holds BartForConditionalGeneration's tensors but names BartForCausalLM: the
    # encoder (and the shared table) have no place in it, its decoder embedding and head are random.
    folder = _copy(hf_folders["bart"], tmp_path / "bart", ["BartForCausalLM"])
    at = run_page("../app.py", f"hf:{folder}", timeout=120)
    shown = "\n".join(df.value.to_string() for df in at.dataframe)
    assert "hf-not-saved-model" in shown and "left-at-init" in shown
    assert any("hf-not-saved-model" in e.value for e in at.error)


# ------------------------------------------------------------ families beyond token-id text models

#: The inputs each family's forward gets, by name and shape (batch 2), worked out from its config:
#: Whisper 8 mel bins x 2 * max_source_positions (8) frames; Wav2Vec2 raw audio long enough for
#: 8 frames through its convolutions (kernel 3 stride 2, then kernel 10 stride 5: (8-1)*2+3 = 17,
#: (17-1)*5+10 = 90 samples) and 4 CTC labels; Llava 4 image tokens ((8 / 4)^2 patches) then 8 ids.
FAMILY_INPUTS = {
    "marian": {"input_ids": (2, 8), "attention_mask": (2, 8), "decoder_input_ids": (2, 8)},
    "mixtral": {"input_ids": (2, 8), "attention_mask": (2, 8)},
    "qwen2-moe": {"input_ids": (2, 8), "attention_mask": (2, 8)},
    "whisper": {"input_features": (2, 8, 16), "decoder_input_ids": (2, 8)},
    "wav2vec2": {"input_values": (2, 90), "labels": (2, 4)},
    "clip": {"input_ids": (2, 8), "attention_mask": (2, 8), "pixel_values": (2, 3, 8, 8)},
    "llava": {"input_ids": (2, 12), "attention_mask": (2, 12), "pixel_values": (2, 3, 8, 8)},
    "distilbert": {"input_ids": (2, 8), "attention_mask": (2, 8)},
    "roberta": {"input_ids": (2, 8), "attention_mask": (2, 8)},
}


def transformers_report(folder, cls_name):
    import transformers

    return getattr(transformers, cls_name).from_pretrained(folder, output_loading_info=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_loads_clean_as_transformers_reports(hf_folders, family):
    # transformers' own report is the reference: nothing missing, unexpected or mismatched, so
    # the only finding is the class (no left-at-init for Marian's rebuilt positions or for
    # Mixtral's and Qwen2-MoE's merged experts)
    _, info = transformers_report(hf_folders[family], SAVED_CLASS[family])
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"))
    loaded = load_model(f"hf:{hf_folders[family]}")
    assert type(loaded.model).__name__ == SAVED_CLASS[family]
    assert [(f.code, f.severity) for f in loaded.findings] == [("hf-class", "info")]
    assert_saved_weights(loaded.model, hf_folders[family])
    inputs = loaded.example_inputs(2)
    assert {k: tuple(v.shape) for k, v in inputs.items()} == FAMILY_INPUTS[family]
    loaded.model.zero_grad()
    loss = loaded.loss(loaded.model(**inputs), inputs)
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_llava_runs_its_vision_tower(hf_folders):
    loaded = load_model(f"hf:{hf_folders['llava']}")
    inputs = loaded.example_inputs(1)
    assert (inputs["input_ids"][0, :4] == 63).all() and (inputs["input_ids"][0, 4:] != 63).all()
    model = loaded.model
    try:
        loaded.loss(model(**inputs), inputs).backward()
        tower = dict(model.model.vision_tower.named_parameters())
        # the features come from the last encoder layer, before post_layernorm (Llava's choice)
        reached = {n for n, p in tower.items() if p.grad is not None and p.grad.abs().sum() > 0}
        assert set(tower) - reached == {"post_layernorm.weight", "post_layernorm.bias"}
    finally:
        model.zero_grad(set_to_none=True)


def test_whisper_without_architectures_keeps_its_encoder(hf_folders, tmp_path):
    folder = _copy(hf_folders["whisper"], tmp_path / "whisper", None)
    loaded = load_model(f"hf:{folder}")
    assert type(loaded.model).__name__ == "WhisperForConditionalGeneration"  # not WhisperForCausalLM
    assert [(f.code, f.severity) for f in loaded.findings] == [("hf-class-guessed", "warning")]
    assert "first fallback with a place for every saved tensor" in loaded.findings[0].message
    for family, cls in (("clip", "CLIPModel"), ("llava", "LlavaForConditionalGeneration")):
        folder = _copy(hf_folders[family], tmp_path / family, None)
        assert type(load_model(f"hf:{folder}").model).__name__ == cls


def test_a_fallback_that_leaves_saved_tensors_unused_is_an_error(hf_folders, tmp_path):
    from safetensors.torch import save_file

    folder = _copy(hf_folders["whisper"], tmp_path / "whisper", None)
    state = load_file(str(folder / "model.safetensors"))
    state["extra.weight"] = torch.zeros(2)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    loaded = load_model(f"hf:{folder}")
    assert type(loaded.model).__name__ == "WhisperForConditionalGeneration"
    got = {(f.code, f.severity, f.where) for f in loaded.findings}
    assert got == {("hf-not-saved-model", "error", ""), ("hf-class-guessed", "error", ""),
                   ("unexpected-tensor", "error", "extra.weight")}


def test_merged_experts_and_an_extra_key_follow_the_report(hf_folders, tmp_path):
    from safetensors.torch import save_file

    from inspector.loading.hf_saved import check_saved

    folder = _copy(hf_folders["mixtral"], tmp_path / "mixtral", ["MixtralForCausalLM"])
    state = load_file(str(folder / "model.safetensors"))
    state["extra.weight"] = torch.zeros(2)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    model, info = transformers_report(folder, "MixtralForCausalLM")
    assert info["unexpected_keys"] == {"extra.weight"} and not info["missing_keys"]
    loaded = load_model(f"hf:{folder}")
    assert [(f.code, f.severity, f.where) for f in loaded.findings] == [
        ("hf-class", "info", ""), ("unexpected-tensor", "warning", "extra.weight")]  # no hf-not-saved-model
    # without a report, values decide: the merged tensor equals the saved experts until it changes
    assert check_saved(model, folder).left == () and check_saved(model, folder).differ == ()
    with torch.no_grad():
        model.model.layers[0].mlp.experts.gate_up_proj[1, 0, 0] += 1
    assert check_saved(model, folder).differ == ("model.layers.0.mlp.experts.gate_up_proj",)


def test_a_missing_expert_is_named(hf_folders, tmp_path):
    from safetensors.torch import save_file

    folder = _copy(hf_folders["qwen2-moe"], tmp_path / "qwen", ["Qwen2MoeForCausalLM"])
    state = load_file(str(folder / "model.safetensors"))
    del state["model.layers.0.mlp.experts.1.up_proj.weight"]
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(InspectorError) as caught:
        load_model(f"hf:{folder}")
    message = str(caught.value)
    assert (
        "needs saved tensors the folder does not hold: model.layers.0.mlp.experts.1.up_proj.weight" in message
    )
    assert "above report" not in message


def test_a_removed_tied_embedding_is_reported_once(hf_folders, tmp_path):
    from safetensors.torch import save_file

    folder = _copy(hf_folders["llama-tied"], tmp_path / "llama", ["LlamaForCausalLM"])
    state = load_file(str(folder / "model.safetensors"))
    del state["model.embed_tokens.weight"]
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _, info = transformers_report(folder, "LlamaForCausalLM")
    assert info["missing_keys"] == {"model.embed_tokens.weight", "lm_head.weight"}  # one tensor, two names
    left = [f for f in load_model(f"hf:{folder}").findings if f.code == "left-at-init"]
    assert [(f.where, f.severity) for f in left] == [("model.embed_tokens.weight", "warning")]
    assert "the same tensor as lm_head.weight" in left[0].message


def test_a_class_for_another_config_is_named_as_such():
    import transformers

    choice = choose_class(transformers.Qwen2Config(architectures=["LlamaForCausalLM"]))
    assert choice.chosen.__name__ == "Qwen2ForCausalLM" and choice.exists
    assert (
        "LlamaForCausalLM, a class for LlamaConfig, but config.json describes a Qwen2Config" in choice.reason
    )
    message = class_findings(choice)[0].message
    assert "Install a transformers version" not in message and "fix its model_type" in message


FAMILY_COMMANDS = {"attribute": ["--steps", "2"], "offsets": ["--backward"]}
#: the families whose loss is new here (features, CTC labels, contrastive, image tokens) run backward too
NEW_LOSS = {"whisper", "wav2vec2", "clip", "llava"}


@pytest.mark.parametrize("family", FAMILIES)
def test_family_commands(hf_folders, family, capsys):
    # every family runs: attribute with no --target attributes the predicted class or token, says
    # so, and attributes the features or pixels (Whisper, Wav2Vec2) or the token embedding
    for command, extra in FAMILY_COMMANDS.items():
        if command == "offsets" and family not in NEW_LOSS:
            continue
        code = main([command, f"hf:{hf_folders[family]}", *extra])
        out, err = capsys.readouterr()
        assert code == 0, (command, err[-2000:])
        if command == "attribute" and family != "clip":  # CLIP: one score per image-text pair, no target
            assert "(predicted: no --target given)" in out and "attribution-target" in out, out[-1500:]
