"""Sample models, loading, checkpoints, devices and tie-keeping moves."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from inspector import (
    InspectorError,
    apply_checkpoint,
    available_devices,
    load_model,
    model_summary,
    move_model,
)
from sample_models import GPT, GPT2_SMALL, SAMPLES, get_sample

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def unique_elements(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --- sample models -----------------------------------------------------------------------

def test_tiny_gpt2_counts_and_tie(tiny_gpt2):
    # wte 32*16=512, wpe 16*16=256, ln_1 32, c_attn 16*48+48=816, attn c_proj 16*16+16=272,
    # ln_2 32, c_fc 16*64+64=1088, mlp c_proj 64*16+16=1040, ln_f 32 -> 4080; lm_head 512 tied.
    assert unique_elements(tiny_gpt2) == 4080
    assert sum(p.numel() for _, p in tiny_gpt2.named_parameters(remove_duplicate=False)) == 4592
    assert tiny_gpt2.lm_head.weight is tiny_gpt2.transformer.wte.weight
    assert [n for n, _ in tiny_gpt2.named_buffers()] == ["transformer.h.0.attn.causal_mask"]
    logits = tiny_gpt2(get_sample("tiny-gpt2").example_inputs(2))
    assert logits.shape == (2, 16, 32)


def test_gpt2_small_is_124m_without_allocating():
    with torch.device("meta"):
        model = GPT(GPT2_SMALL)
    # 50257*768 + 1024*768 + 12 * 7,087,872 (one block) + 2*768 (ln_f) = 124,439,808
    assert unique_elements(model) == 124_439_808


def test_cnn_bn_has_running_stats_and_inplace_relu():
    model = get_sample("cnn-bn").build()
    assert {n for n, _ in model.named_buffers()} == {
        "bn2.running_mean", "bn2.running_var", "bn2.num_batches_tracked"}
    assert model.relu1.inplace and model.relu2.inplace
    assert unique_elements(model) == 224 + 1168 + 32 + 170


def test_frozen_adapter_interleaves_frozen_and_trainable():
    model = get_sample("frozen-adapter").build()
    flags = [p.requires_grad for p in model.parameters()]
    assert flags[:4] == [False, False, True, True]
    assert flags.count(True) == 3 * 2 and flags.count(False) == 3 * 2


def test_split_block_owns_buffers_directly():
    model = get_sample("split-block").build()
    assert set(model.block._buffers) == {"scale", "pos_table"}
    assert len([m for m in model.block.children() if isinstance(m, nn.Linear)]) == 3


def test_llama_70b_meta_structure_only():
    model = get_sample("llama-70b-meta").build()
    # per layer: q,o 8192^2 each; k,v 8192*1024 each; mlp 3*8192*28672; two norms 8192 each
    per_layer = 2 * 8192**2 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    assert unique_elements(model) == 80 * per_layer + 2 * 32000 * 8192 + 8192
    assert all(p.device.type == "meta" for p in model.parameters())
    assert dict(model.named_buffers())["rotary_emb.inv_freq"].shape == (64,)


def test_every_sample_has_description_inputs_and_loss():
    for name, sample in SAMPLES.items():
        assert len(sample.description) > 80, name
        if not sample.meta_only and name != "gpt2-small":
            model = sample.build()
            inputs = sample.example_inputs(2)
            loss = sample.loss(model(inputs), inputs)
            assert loss.ndim == 0 and torch.isfinite(loss), name


# --- load_model --------------------------------------------------------------------------

def test_unknown_sample_lists_known_ones():
    with pytest.raises(InspectorError, match="known samples: tiny-gpt2"):
        load_model("sample:gpt5")


def test_python_file_from_allowed_folder():
    loaded = load_model(f"{PROJECT_ROOT / 'sample_models' / 'small.py'}:ConvNet")
    assert unique_elements(loaded.model) == 1594


def test_python_file_outside_allowed_folders_is_refused_and_not_run(tmp_path, monkeypatch):
    marker = tmp_path / "ran"
    f = tmp_path / "evil.py"
    f.write_text(
        f"open({str(marker)!r}, 'w').write('x')\nimport torch\ndef make(): return torch.nn.Linear(1, 1)\n"
    )
    monkeypatch.delenv("INSPECTOR_MODEL_DIRS", raising=False)
    with pytest.raises(InspectorError, match="INSPECTOR_MODEL_DIRS"):
        load_model(f"{f}:make")
    assert not marker.exists()
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    assert isinstance(load_model(f"{f}:make").model, nn.Linear)


def test_factory_that_raises_is_summarised(tmp_path, monkeypatch):
    f = tmp_path / "bad.py"
    f.write_text("def make():\n    raise RuntimeError('no GPU budget')\n")
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    with pytest.raises(InspectorError, match=r"bad.py:make\(\) raised RuntimeError: no GPU budget"):
        load_model(f"{f}:make")
    with pytest.raises(InspectorError, match="has no callable 'missing'"):
        load_model(f"{f}:missing")


def test_meta_model_refuses_forward_and_real_devices():
    loaded = load_model("sample:llama-70b-meta", device="meta")
    with pytest.raises(InspectorError, match="meta device"):
        loaded.check_runnable()
    with pytest.raises(InspectorError, match="meta"):
        load_model("sample:llama-70b-meta", device="cpu")


def test_unknown_device_lists_available_ones():
    with pytest.raises(InspectorError, match="Available devices: .*cpu"):
        load_model("sample:tiny-gpt2", device="cuda:7")
    with pytest.raises(InspectorError, match="unknown device"):
        load_model("sample:tiny-gpt2", device="gpu-please")


def test_available_devices_lists_cpu_and_meta():
    names = [d.name for d in available_devices()]
    assert names[0] == "cpu" and names[-1] == "meta"
    assert sum(n.startswith("cuda:") for n in names) == torch.cuda.device_count()


def test_dtype_argument():
    loaded = load_model("sample:cnn-bn", dtype="float64")
    assert loaded.model.conv1.weight.dtype == torch.float64
    assert loaded.model.bn2.num_batches_tracked.dtype == torch.long  # integers keep their dtype
    with pytest.raises(InspectorError, match="unknown dtype"):
        load_model("sample:cnn-bn", dtype="float8")


# --- checkpoints -------------------------------------------------------------------------

def test_safetensors_round_trip_keeps_one_name_and_restores_the_tie(tmp_path):
    from safetensors.torch import save_model

    src = get_sample("tiny-gpt2").build()
    with torch.no_grad():
        src.transformer.wte.weight.add_(1.0)
    path = tmp_path / "tiny.safetensors"
    save_model(src, str(path))  # drops one of the two tied names
    loaded = load_model("sample:tiny-gpt2", checkpoint=path)
    m = loaded.model
    assert m.lm_head.weight is m.transformer.wte.weight
    assert torch.equal(m.transformer.wte.weight, src.transformer.wte.weight)
    assert unique_elements(m) == 4080
    restored = [f for f in loaded.findings if f.code == "tie-restored"]
    assert len(restored) == 1 and restored[0].severity == "info"


def test_pt_checkpoint_missing_and_unexpected_keys(tmp_path):
    state = get_sample("cnn-bn").build().state_dict()
    state.pop("fc.bias")
    state["extra.weight"] = torch.zeros(2)
    path = tmp_path / "cnn.pt"
    torch.save(state, path)
    loaded = load_model("sample:cnn-bn", checkpoint=path)
    codes = {(f.code, f.where) for f in loaded.findings}
    assert ("missing-key", "fc.bias") in codes and ("unexpected-key", "extra.weight") in codes


def test_shape_mismatch_names_tensor_and_both_shapes(tmp_path):
    state = get_sample("cnn-bn").build().state_dict()
    state["fc.weight"] = torch.zeros(5, 16)
    path = tmp_path / "cnn.pt"
    torch.save(state, path)
    model = get_sample("cnn-bn").build()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(
        InspectorError, match=r"fc.weight has shape \(5, 16\) but the model expects \(10, 16\)"
    ):
        apply_checkpoint(model, path)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (Path(self.marker), "pwned"))


def test_hostile_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "payload-ran"
    path = tmp_path / "evil.pt"
    with open(path, "wb") as fh:
        pickle.dump({"fc.weight": _Payload(str(marker))}, fh)
    torch_path = tmp_path / "evil2.pt"
    torch.save({"fc.weight": _Payload(str(marker))}, torch_path)
    for p in (path, torch_path):
        with pytest.raises(InspectorError, match="refused: it asks to run Python code"):
            load_model("sample:cnn-bn", checkpoint=p)
    assert not marker.exists()


def test_corrupt_and_non_state_dict_checkpoints(tmp_path):
    bad = tmp_path / "broken.safetensors"
    bad.write_bytes(b"\x00\x01garbage")
    with pytest.raises(InspectorError, match="broken.safetensors is not a readable safetensors file"):
        load_model("sample:cnn-bn", checkpoint=bad)
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a zip file at all")
    with pytest.raises(InspectorError, match="junk.pt is corrupt"):
        load_model("sample:cnn-bn", checkpoint=junk)
    lst = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], lst)
    with pytest.raises(InspectorError, match="list.pt is not a state dict"):
        load_model("sample:cnn-bn", checkpoint=lst)
    with pytest.raises(InspectorError, match="does not exist"):
        load_model("sample:cnn-bn", checkpoint=tmp_path / "nope.pt")


def test_nested_state_dict_is_used(tmp_path):
    path = tmp_path / "trainer.pt"
    torch.save({"state_dict": get_sample("cnn-bn").build().state_dict(), "epoch": 3}, path)
    loaded = load_model("sample:cnn-bn", checkpoint=path)
    assert [f.code for f in loaded.findings] == ["checkpoint-nested"]


# --- move_model --------------------------------------------------------------------------

def test_plain_to_splits_tie_under_overwrite_flag_move_model_does_not(overwrite_flag):
    plain = get_sample("tiny-gpt2").build().to(torch.float64)
    assert unique_elements(plain) == 4592
    model = get_sample("tiny-gpt2").build()
    wte = model.transformer.wte.weight
    move_model(model, dtype=torch.float64)
    assert unique_elements(model) == 4080
    assert model.lm_head.weight is model.transformer.wte.weight is wte
    assert wte.dtype == torch.float64
    move_model(model, "cpu", torch.float32)
    assert model.lm_head.weight is wte and wte.dtype == torch.float32


def test_move_model_keeps_shared_storage_and_buffer_ties_and_grads():
    # two Parameter objects over one storage, and a buffer held by two modules
    base = torch.arange(6.0)
    m = nn.Module()
    m.a = nn.Module()
    m.b = nn.Module()
    m.a.w = nn.Parameter(base)
    m.b.w = nn.Parameter(base)
    table = torch.ones(3)
    m.a.register_buffer("t", table)
    m.b.register_buffer("t", table)
    m.a.w.grad = torch.ones(6)
    move_model(m, dtype=torch.float64)
    assert m.a.w is not m.b.w
    assert m.a.w.untyped_storage().data_ptr() == m.b.w.untyped_storage().data_ptr()
    assert m.a.t is m.b.t and m.a.t.dtype == torch.float64
    assert m.a.w.grad.dtype == torch.float64
    assert torch.equal(m.a.w, torch.arange(6.0, dtype=torch.float64))


def test_move_off_meta_is_refused_unless_empty():
    model = get_sample("tiny-gpt2").build()
    move_model(model, "meta")  # a plain .to("meta") makes new Parameters per slot: the tie is lost
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.lm_head.weight.device.type == "meta"
    with pytest.raises(InspectorError, match="meta device and hold no data"):
        move_model(model, "cpu")
    move_model(model, "cpu", empty=True)
    assert model.lm_head.weight is model.transformer.wte.weight
    assert model.lm_head.weight.device.type == "cpu"


@pytest.mark.cuda
def test_load_on_cuda_keeps_ties(overwrite_flag):
    loaded = load_model("sample:tiny-gpt2", device="cuda:0", dtype="float16")
    m = loaded.model
    assert m.lm_head.weight is m.transformer.wte.weight
    assert m.lm_head.weight.device.type == "cuda"
    assert unique_elements(m) == 4080


# --- Hugging Face folders ----------------------------------------------------------------

def test_hf_local_directory(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2-tiny")
    loaded = load_model(f"hf:{tmp_path / 'gpt2-tiny'}")
    m = loaded.model
    assert m.lm_head.weight is m.transformer.wte.weight
    inputs = loaded.example_inputs(2)
    loss = loaded.loss(m(**inputs), inputs)
    assert torch.isfinite(loss)
    with pytest.raises(InspectorError, match="no config.json"):
        load_model(f"hf:{tmp_path}")


# --- summary and command line -------------------------------------------------------------

def test_summary_counts(tiny_gpt2):
    s = model_summary(tiny_gpt2)
    assert (s.parameter_elements, s.parameter_elements_with_aliases, s.aliased_elements) == (4080, 4592, 512)
    assert (s.buffers, s.buffer_elements) == (1, 256)
    assert s.bytes_table.query("kind == 'parameter'")["bytes"].sum() == 4080 * 4


def test_cli_summary():
    out = subprocess.run([sys.executable, "-m", "inspector", "summary", "sample:tiny-gpt2"],
                         capture_output=True, text=True, cwd=PROJECT_ROOT, check=True).stdout
    assert "4,080 unique, 4,592 counting aliases" in out
    bad = subprocess.run([sys.executable, "-m", "inspector", "summary", "sample:nope"],
                         capture_output=True, text=True, cwd=PROJECT_ROOT)
    assert bad.returncode == 2 and "known samples" in bad.stderr


def test_hf_folder_without_transformers_names_the_extra(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text('{"model_type": "gpt2"}')
    monkeypatch.setitem(sys.modules, "transformers", None)  # as where the hf extra is not installed
    with pytest.raises(InspectorError, match=r"needs transformers: pip install 'transformers>=5.23,<6'"):
        load_model(f"hf:{tmp_path}")
