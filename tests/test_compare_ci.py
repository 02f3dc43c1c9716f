"""compare in CI: --fail-on, strict JSON against its schema, grouped and expected unchanged tensors,
zero-initialised tensors, float8 and dtype changes, low-rank updates."""

from __future__ import annotations

import json

import jsonschema
import pandas as pd
import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from inspector import compare
from inspector.__main__ import main
from inspector.comparison import JSON_SCHEMA


def stack(layers: int = 4, width: int = 64) -> nn.Module:
    """``layers`` Linear(width, width) blocks under ``h.N`` plus an embedding ``wte`` (10 x width)."""
    torch.manual_seed(0)
    model = nn.Module()
    model.wte = nn.Embedding(10, width)
    model.h = nn.ModuleList([nn.Linear(width, width) for _ in range(layers)])
    return model


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def codes(result) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in result.findings:
        out.setdefault(f.code, []).append(f)
    return out


def test_fail_on_and_strict_json_that_a_schema_validates(tmp_path, capsys):
    a = stack()
    save_file(state_of(a), str(tmp_path / "a.safetensors"))
    b = state_of(a)
    b["h.0.weight"][0, 0] = float("inf")  # nonfinite (error): norms of h.0.weight are NaN
    b["h.1.bias"] += 1
    save_file(b, str(tmp_path / "b.safetensors"))
    args = ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")]
    out = tmp_path / "c.json"
    assert main(args + ["--json", str(out)]) == 0  # no --fail-on: findings never fail
    assert main(args + ["--fail-on", "error"]) == 1
    assert "failing (--fail-on error)" in capsys.readouterr().out
    text = out.read_text()
    assert ": NaN" not in text and ": Infinity" not in text
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict constant {c}"))
    jsonschema.validate(data, JSON_SCHEMA)
    row = next(r for r in data["tensors"] if r["name"] == "h.0.weight")
    assert row["diff_norm"] == "nan" and row["nonfinite_b"] == 1 and row["update_rank"] is None
    # the same folder compared with itself has no finding: neither level fails
    same = ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "a.safetensors")]
    assert main(same + ["--fail-on", "warning"]) == 0
    assert main(same + ["--fail-on", "fatal"]) == 2  # a bad choice is bad input
    assert "invalid choice" in capsys.readouterr().err
    assert main(["compare", "x.inspect", "y.inspect", "--tolerance", "-1"]) == 2


def test_one_grouped_warning_for_many_unchanged_tensors_and_expected_ones_are_info(tmp_path):
    a = stack(layers=40)
    b = state_of(a)
    for i in range(40):
        if i not in (3, 7):  # h.3 and h.7 were left out of training; wte is frozen on purpose
            b[f"h.{i}.weight"] += 0.01
            b[f"h.{i}.bias"] += 0.01
    result = compare(a, b)
    found = codes(result)
    assert len(found["unchanged-tensor"]) == 1 and found["unchanged-tensor"][0].severity == "warning"
    msg = found["unchanged-tensor"][0].message
    assert msg.startswith("4 of 81 trainable tensors") and "all 2 trainable tensors of h.3" in msg
    frozen = found["unchanged-expected"][0]
    assert frozen.severity == "info" and "1 tensors form a frozen set" in frozen.message
    assert result.facts["summary"] == "76 of 81 tensors changed; 5 unchanged: wte, h.3, h.7"
    expected = compare(a, b, expect_unchanged=["h.3", "h.7"])
    assert "unchanged-tensor" not in expected.codes()
    assert "4 tensors are unchanged as expected (h.3, h.7): h.3, h.7" in [
        f.message for f in expected.findings]
    args = ["compare", str(_save(a, tmp_path / "a.pt")), str(_save(b, tmp_path / "b.pt"))]
    assert main([*args, "--expect-unchanged", "h.[37]", "--fail-on", "warning"]) == 0
    # a pattern that names nothing, or a tensor that did change, is a warning: CI catches the mistake
    wrong = compare(a, b, expect_unchanged=["h.3", "h.7", "h.9", "*.wtee"])
    unmatched = [f for f in wrong.findings if f.code == "expect-unmatched"]
    assert [f.where for f in unmatched] == ["*.wtee"]
    moved = [f for f in wrong.findings if f.code == "changed-unexpectedly"]
    assert len(moved) == 1 and moved[0].message.startswith("2 tensors expected unchanged")
    assert main([*args, "--expect-unchanged", "h.[37]", "--expect-unchanged", "h.9",
                 "--fail-on", "warning"]) == 1


def _save(model_or_state, path):
    state = model_or_state if isinstance(model_or_state, dict) else state_of(model_or_state)
    torch.save(state, path)
    return path


def test_zero_initialised_tensors_have_no_infinite_ratio():
    a = stack(layers=1)
    with torch.no_grad():
        a.h[0].bias.zero_()
    b = state_of(a)
    b["h.0.bias"] += 0.5  # 64 elements: ||B - A|| = sqrt(64 * 0.25) = 4
    result = compare(a, b)
    row = result.tensors.set_index("name").loc["h.0.bias"]
    assert row["diff_norm"] == pytest.approx(4.0) and row["norm_a"] == 0
    assert row["rel_change"] != row["rel_change"]  # NaN, not inf
    assert not (result.modules["rel_change"] == float("inf")).any()
    f = codes(result)["changed-from-zero"][0]
    assert "1 tensors are all zeros in A" in f.message and "h.0.bias" in f.message


def test_float8_and_dtype_changes_are_compared_in_float32_and_never_equal(tmp_path):
    torch.manual_seed(0)
    w = torch.randn(4, 8)
    fp8 = w.to(torch.float8_e4m3fn)
    save_file({"w": w, "exact": torch.ones(3)}, str(tmp_path / "a.safetensors"))
    save_file({"w": fp8, "exact": torch.ones(3, dtype=torch.float64)}, str(tmp_path / "b.safetensors"))
    result = compare(tmp_path / "a.safetensors", tmp_path / "b.safetensors")
    rows = result.tensors.set_index("name")
    assert rows.loc["w", "status"] == "dtype-changed" and rows.loc["w", "exact_cast"]
    # the change is exactly the float8 rounding error, computed in float32
    assert rows.loc["w", "max_abs"] == pytest.approx(float((fp8.float() - w).abs().max()))
    # float32 -> float64 widens exactly, yet the tensors are not "bitwise equal"
    assert not rows.loc["exact", "bitwise_equal"] and rows.loc["exact", "max_abs"] == 0
    assert result.facts["equal"] == 0
    assert any("float8_e4m3fn keeps 4 significant bits" in f.message for f in result.findings)
    # two float8 files of one dtype: streamed like any other dtype
    save_file({"w": fp8}, str(tmp_path / "c.safetensors"))
    save_file({"w": (w * 2).to(torch.float8_e4m3fn)}, str(tmp_path / "d.safetensors"))
    r = compare(tmp_path / "c.safetensors", tmp_path / "d.safetensors")
    expected = ((w * 2).to(torch.float8_e4m3fn).float() - fp8.float()).norm()
    assert r.tensors.loc[0, "diff_norm"] == pytest.approx(float(expected), rel=1e-6)
    # the other float8 kinds safetensors writes: e5m2, and e8m0 (powers of two, as MX scales are)
    scales = torch.tensor([0.25, 0.5, 1.0, 4.0])
    e = {"w": w.to(torch.float8_e5m2), "s": scales.to(torch.float8_e8m0fnu)}
    save_file(e, str(tmp_path / "e.safetensors"))
    save_file({"w": w, "s": scales}, str(tmp_path / "f.safetensors"))
    rows = compare(tmp_path / "e.safetensors", tmp_path / "f.safetensors").tensors.set_index("name")
    assert rows.loc["s", "max_abs"] == 0 and rows.loc["s", "status"] == "dtype-changed"  # exact in float32
    assert rows.loc["w", "max_abs"] == pytest.approx(float((w.to(torch.float8_e5m2).float() - w).abs().max()))


def test_a_merged_low_rank_adapter_reads_as_one_rank(tmp_path):
    """q and v of 6 layers get B @ A with rank 8 (as a merged LoRA); the MLP gets a full-rank change."""
    torch.manual_seed(0)
    base = {f"layers.{i}.{p}.weight": torch.randn(96, 64) for i in range(6) for p in ("q", "v", "mlp")}
    merged = {}
    for name, w in base.items():
        if name.endswith("mlp.weight"):
            merged[name] = w + 0.01 * torch.randn_like(w)
        else:
            merged[name] = w + torch.randn(96, 8) @ torch.randn(8, 64) * 0.01
    save_file(base, str(tmp_path / "base.safetensors"))
    save_file(merged, str(tmp_path / "merged.safetensors"))
    result = compare(tmp_path / "base.safetensors", tmp_path / "merged.safetensors")
    low = codes(result)["low-rank-update"]
    assert len(low) == 1 and low[0].message.startswith("rank-8 update on 12 matrices (of 18 changed")
    ranks = result.tensors.set_index("name")["update_rank"]
    assert ranks["layers.0.q.weight"] == 8 and ranks["layers.0.mlp.weight"] is pd.NA
    assert result.facts["low_rank"] == 12


def test_a_merged_lora_on_gpt2_is_quiet_and_reads_as_its_rank(tmp_path, capsys):
    """Tiny GPT-2 (4 layers, n_embd 64): c_attn (64 x 192) of every layer gets a rank-4 B @ A merged in,
    as PEFT's merge_and_unload does; everything else stays. No warning: the unchanged tensors are a frozen
    set (no layer's c_attn stayed while another's moved), so --fail-on warning passes."""
    import transformers as tf

    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=96, n_positions=32, n_embd=64, n_layer=4, n_head=2))
    model.save_pretrained(tmp_path / "base")
    with torch.no_grad():
        for block in model.transformer.h:
            w = block.attn.c_attn.weight  # Conv1D: (in 64, out 192)
            w += (torch.randn(64, 4) @ torch.randn(4, 192)) * 0.02
    model.save_pretrained(tmp_path / "merged")
    result = compare(tmp_path / "base", tmp_path / "merged")
    assert [f.severity for f in result.findings] == ["info", "info"]
    assert result.codes() == ["unchanged-expected", "low-rank-update"]
    assert result.findings[1].message.startswith("rank-4 update on 4 matrices (of 4 changed matrices")
    # 4 blocks x 12 tensors + wte, wpe, ln_f.weight, ln_f.bias = 52 (lm_head is tied: stored once)
    assert result.facts["summary"].startswith("4 of 52 tensors changed; 48 unchanged")
    args = ["compare", str(tmp_path / "base"), str(tmp_path / "merged"), "--fail-on", "warning"]
    assert main(args) == 0
    assert "rank-4 update on 4 matrices" in capsys.readouterr().out
    (tmp_path / "merged" / "model.safetensors.index.json").write_text("{not json")
    assert main(args) == 2
    assert "model.safetensors.index.json is not a readable checkpoint index" in capsys.readouterr().err
