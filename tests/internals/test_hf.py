"""Hugging Face folders: the class they name, every saved tensor checked, inputs from the config."""

from __future__ import annotations

import json
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file, save_file

from inspector.__main__ import main
from inspector.attribution import attribute, embedding_layer
from inspector.loading.hf import choose_class
from inspector.loading.models import load_model

transformers = pytest.importorskip("transformers")


def copy_folder(folder, to, **config_changes):
    to.mkdir()
    for f in folder.iterdir():
        (to / f.name).write_bytes(f.read_bytes())
    config = json.loads((to / "config.json").read_text())
    for key, value in config_changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (to / "config.json").write_text(json.dumps(config))
    return to


def codes(findings):
    return Counter((f.code, f.severity) for f in findings)


def test_choose_class_order():
    bart = transformers.BartConfig()
    assert choose_class(transformers.BartConfig(architectures=["BartForCausalLM"])).chosen.__name__ == \
        "BartForCausalLM"
    # none named: an encoder-decoder config tries sequence-to-sequence first
    assert choose_class(bart).chosen.__name__ == "BartForConditionalGeneration"
    assert choose_class(transformers.BertConfig()).chosen.__name__ == "BertLMHeadModel"  # causal LM first
    assert choose_class(transformers.ViTConfig()).chosen.__name__ == "ViTForImageClassification"
    # names that are not transformers model classes are passed over
    for name in ("os.system", "AutoConfig", "pipeline", "GPT2LMHeadModel"):
        choice = choose_class(transformers.BartConfig(architectures=[name]))
        assert choice.chosen.__name__ == "BartForConditionalGeneration" and not choice.is_saved


def test_bart_saved_whole_and_named_as_causal_lm_is_not_the_saved_model(hf_folders, tmp_path):
    # BartForCausalLM has the decoder only: the 19 encoder tensors, the shared table and
    # final_logits_bias (21 of the 50 saved) have no place in it; its decoder embedding and head
    # (tied to each other, not to a saved tensor) keep their random initial values: transformers
    # reports both names missing, and the one tensor is reported once, naming both.
    folder = copy_folder(hf_folders["bart"], tmp_path / "bart", architectures=["BartForCausalLM"])
    loaded = load_model(f"hf:{folder}")
    assert type(loaded.model).__name__ == "BartForCausalLM"
    c = codes(loaded.findings)
    assert c[("hf-not-saved-model", "error")] == 1 and c[("hf-class", "info")] == 1
    assert (
        c[("left-at-init", "error")] == 1 and c[("unexpected-tensor", "error")] == 21
    )  # 20 named + "1 more"
    left = next(f for f in loaded.findings if f.code == "left-at-init")
    assert (
        left.where == "model.decoder.embed_tokens.weight"
        and "the same tensor as lm_head.weight" in left.message
    )
    summary = next(f.message for f in loaded.findings if f.code == "hf-not-saved-model")
    assert "21 saved tensors" in summary and "1 of its tensors" in summary


def test_unknown_class_falls_back_and_says_so(hf_folders, tmp_path):
    folder = copy_folder(hf_folders["t5"], tmp_path / "t5", architectures=["T5ForSomethingNew"])
    loaded = load_model(f"hf:{folder}")
    assert type(loaded.model).__name__ == "T5ForConditionalGeneration"
    assert codes(loaded.findings) == {
        ("hf-class-differs", "warning"): 1
    }  # every saved tensor found its place
    folder = copy_folder(hf_folders["gpt2"], tmp_path / "gpt2", architectures=None)
    loaded = load_model(f"hf:{folder}")
    assert type(loaded.model).__name__ == "GPT2LMHeadModel"
    assert codes(loaded.findings) == {("hf-class-guessed", "warning"): 1}


def test_a_tensor_missing_from_the_file_is_left_at_init(hf_folders, tmp_path):
    folder = copy_folder(hf_folders["gpt2"], tmp_path / "gpt2")
    state = load_file(str(folder / "model.safetensors"))
    del state["transformer.ln_f.weight"]
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    loaded = load_model(f"hf:{folder}")
    assert codes(loaded.findings) == {("hf-class", "info"): 1, ("left-at-init", "warning"): 1}
    assert loaded.findings[1].where == "transformer.ln_f.weight"


def test_config_asks_for_a_tie_the_saved_values_refuse(hf_folders, tmp_path):
    # saved untied (lm_head != embed_tokens), the config now says tie: transformers keeps both
    folder = copy_folder(hf_folders["llama-untied"], tmp_path / "llama", tie_word_embeddings=True)
    loaded = load_model(f"hf:{folder}")
    m = loaded.model
    assert m.lm_head.weight is not m.model.embed_tokens.weight
    assert codes(loaded.findings) == {("hf-class", "info"): 1, ("hf-tie-skipped", "warning"): 1}
    assert (
        loaded.findings[1].where == "lm_head.weight"
        and "model.embed_tokens.weight" in loaded.findings[1].message
    )
    # the aliases view lists tied tensors only, so the advice does not send the user there for a pair
    from inspector import alias_groups

    assert not alias_groups(m) or all("lm_head.weight" not in g.names for g in alias_groups(m))
    assert "shows the pair" not in loaded.findings[1].message and "tie_weights" in loaded.findings[1].message


def test_dtype_changed_by_the_config(hf_folders, tmp_path):
    folder = tmp_path / "half"
    model = transformers.GPT2LMHeadModel.from_pretrained(hf_folders["gpt2"]).half()
    model.save_pretrained(folder)
    assert load_model(f"hf:{folder}").model.lm_head.weight.dtype == torch.float16  # dtype "auto": as saved
    config = json.loads((folder / "config.json").read_text())
    config["dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load_model(f"hf:{folder}")
    changed = [f for f in loaded.findings if f.code == "dtype-changed"]
    assert len(changed) == 16 and "saved as float16" in changed[0].message  # GPT-2's 16 saved tensors


def test_shape_changed_in_the_config_loads_and_says_which(hf_folders, tmp_path, capsys):
    # vocab_size 65 in config.json, 64 rows saved: transformers reports wte as mismatched and
    # leaves it at its initial value; the findings name it with both shapes (lm_head is tied to it)
    folder = copy_folder(hf_folders["gpt2"], tmp_path / "gpt2", vocab_size=65)
    model, loading = transformers.GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True,
                                                                   ignore_mismatched_sizes=True)
    assert {k for k, *_ in loading["mismatched_keys"]} == {"transformer.wte.weight"}
    loaded = load_model(f"hf:{folder}")
    assert codes(loaded.findings) == {("hf-class", "info"): 1, ("hf-not-saved-model", "error"): 1,
                                      ("shape-changed", "error"): 1}
    changed = next(f for f in loaded.findings if f.code == "shape-changed")
    assert (
        changed.where == "transformer.wte.weight" and "(64, 16) but the model has (65, 16)" in changed.message
    )
    assert main(["summary", f"hf:{folder}"]) == 0
    out = capsys.readouterr().out
    assert "shape-changed [transformer.wte.weight]" in out and "config.json does not describe" in out


def test_inputs_from_the_config(hf_folders):
    t5 = load_model(f"hf:{hf_folders['t5']}")
    inputs = t5.example_inputs(2)
    assert sorted(inputs) == ["attention_mask", "decoder_input_ids", "input_ids"]
    assert inputs["decoder_input_ids"].shape == (2, 8) and int(inputs["input_ids"].max()) < 64
    vit = load_model(f"hf:{hf_folders['vit']}")
    assert {k: tuple(v.shape) for k, v in vit.example_inputs(2).items()} == {"pixel_values": (2, 3, 8, 8)}
    out = vit.model(**vit.example_inputs(2))
    assert out.logits.shape == (2, 3) and torch.isfinite(vit.loss(out, None))
    bert = load_model(f"hf:{hf_folders['bert']}")
    assert sorted(bert.example_inputs(1)) == ["attention_mask", "input_ids"]


def test_encoder_decoder_attributes_through_the_encoder_embedding(hf_folders):
    t5 = load_model(f"hf:{hf_folders['t5']}")
    assert embedding_layer(t5.model) == "encoder.embed_tokens"  # `shared` itself is never called
    result = attribute(t5, None, "ig", target=3, n_steps=2)
    assert result.layer == "encoder.embed_tokens"
    assert result.attributions[0].shape == (1, 8, 16)  # one score per input token and hidden unit


def test_reports_carry_the_loading_findings(hf_folders, tmp_path):
    folder = copy_folder(hf_folders["bart"], tmp_path / "bart", architectures=["BartForCausalLM"])
    out = tmp_path / "r.json"
    assert main(["report", f"hf:{folder}", "--sections", "summary", "-o", str(out)]) == 0
    findings = json.loads(out.read_text())["findings"]
    assert ("hf-not-saved-model", "error") in {(f["code"], f["severity"]) for f in findings}
    assert sum(f["code"] == "left-at-init" for f in findings) == 1  # one tensor under two names


@pytest.mark.cuda
@pytest.mark.parametrize("arch", ["t5", "vit", "llama-tied"])
def test_on_cuda(hf_folders, arch, capsys):
    loaded = load_model(f"hf:{hf_folders[arch]}", device="cuda:0", dtype="float16")
    inputs = loaded.example_inputs(2)
    assert all(t.device.type == "cuda" for t in inputs.values())
    with torch.no_grad():
        loaded.model(**inputs)
    for command in (["capture"], ["attribute", "--target", "1", "--steps", "2"], ["offsets", "--backward"]):
        assert main([command[0], f"hf:{hf_folders[arch]}", "--device", "cuda:0", *command[1:]]) == 0, \
            capsys.readouterr().err


def test_compare_saved_names_changed_values_and_shapes(hf_folders):
    from inspector.loading.hf import mismatch_finding
    from inspector.loading.hf_saved import check_saved, compare_saved

    folder = hf_folders["gpt2"]
    model = load_model(f"hf:{folder}").model
    assert compare_saved(model, folder) == []
    with torch.no_grad():
        model.transformer.ln_f.bias.add_(1.0)
    assert [(f.code, f.where) for f in compare_saved(model, folder)] == [
        ("weight-differs", "transformer.ln_f.bias")
    ]
    # a wider model (n_embd 32, not 16): each of GPT-2's 16 saved tensors (wte, wpe, ln_1, attn
    # c_attn and c_proj, ln_2, mlp c_fc and c_proj, ln_f; weights and biases) has a hidden dimension
    wide = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32,
                                                                n_layer=1, n_head=2))
    check = check_saved(wide, folder)
    found = check.findings()
    assert {f.code for f in found} == {"shape-changed"} and len(found) == 16
    assert mismatch_finding(check).severity == "error"


def test_a_torch_weights_folder_is_checked_too(hf_folders, tmp_path):
    folder = copy_folder(hf_folders["gpt2"], tmp_path / "gpt2")
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    del state["transformer.ln_f.bias"]
    torch.save(state, folder / "pytorch_model.bin")
    loaded = load_model(f"hf:{folder}")
    assert [(f.code, f.where) for f in loaded.findings] == [
        ("hf-class", ""),
        ("left-at-init", "transformer.ln_f.bias"),
    ]
    assert torch.equal(loaded.model.transformer.wte.weight, state["transformer.wte.weight"])


def test_loading_reads_no_saved_value_twice(hf_folders):
    # a clean folder: transformers reports nothing missing, no tensor is filled by two saved ones
    from inspector.loading.hf import choose_class
    from inspector.loading.hf_saved import check_saved

    folder = hf_folders["gpt2"]
    model, loading = choose_class(transformers.AutoConfig.from_pretrained(folder)).chosen.from_pretrained(
        folder, output_loading_info=True)
    check = check_saved(model, folder, loading)
    assert check.values_read == 0 and check.findings() == []
    assert check_saved(model, folder).values_read == 16  # without a report: all 16 saved values
    with torch.no_grad():
        model.transformer.ln_f.bias.add_(1.0)
    # the report says ln_f.bias was loaded: its value is not read (check_saved(model, folder) would)
    assert check_saved(model, folder, loading).differ == ()
    # a report that says it was not loaded: the saved value is read and compared
    missing = {**loading, "missing_keys": {"transformer.ln_f.bias"}}
    check = check_saved(model, folder, missing)
    assert check.values_read == 1 and check.differ == ("transformer.ln_f.bias",)
    assert [(f.code, f.where) for f in check.findings()] == [("weight-differs", "transformer.ln_f.bias")]


def test_a_tensor_saved_twice_is_read_and_compared(hf_folders, tmp_path):
    # a torch file keeps both names of GPT-2's tied table (wte and lm_head): transformers ties
    # them, so both saved values fill one tensor and are compared; the second one here differs
    folder = copy_folder(hf_folders["gpt2"], tmp_path / "gpt2")
    state = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    state["lm_head.weight"] = state["transformer.wte.weight"].clone()
    torch.save(state, folder / "pytorch_model.bin")
    loaded = load_model(f"hf:{folder}")
    assert loaded.model.lm_head.weight is loaded.model.transformer.wte.weight
    assert codes(loaded.findings) == {("hf-class", "info"): 1}
    from inspector.loading.hf_saved import check_saved

    model = loaded.model
    with torch.no_grad():
        model.transformer.wte.weight[0, 0] += 1.0  # as if one of the two saved values had won a tie
    _, loading = transformers.GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
    check = check_saved(model, folder, loading)
    assert check.values_read == 2 and check.differ == ("transformer.wte.weight", "transformer.wte.weight")
