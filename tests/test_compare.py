"""compare(a, b): every finding planted on a tiny tied model; files, prefixes, bfloat16, DCP folders, the
CLI."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from safetensors.torch import save_file, save_model
from torch import nn

from inspector import InspectorError, WeightComparison, compare
from inspector.__main__ import main


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)


class Tiny(nn.Module):
    """embed 4x3 (12) tied to head; blocks.0.fc and blocks.1.fc 3x3 + 3 (12 each): 36 unique elements."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(4, 3)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(3, 4, bias=False)
        self.head.weight = self.embed.weight
        with torch.no_grad():
            for i, p in enumerate(self.parameters()):
                p.copy_(torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) / 10 + i)


def tiny() -> Tiny:
    return Tiny()


def state_of(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def finding(result: WeightComparison, code: str):
    hits = [f for f in result.findings if f.code == code]
    assert len(hits) == 1, (code, result.findings)
    return hits[0]


def test_identical_models_have_no_findings_and_the_model_is_unchanged():
    a = tiny()
    before = {k: (id(v), v.clone()) for k, v in a.state_dict(keep_vars=True).items()}
    result = compare(a, copy.deepcopy(a))
    assert result.codes() == []
    assert set(result.tensors["status"]) == {"equal"}
    assert result.facts["compared"] == 6  # embed, 2 x (weight, bias), head (the tied name)
    after = a.state_dict(keep_vars=True)
    assert all(id(after[k]) == i and torch.equal(after[k], v) for k, (i, v) in before.items())


def test_fine_tune_that_left_one_block_unchanged():
    a = tiny()
    b = copy.deepcopy(a)
    with torch.no_grad():
        b.blocks[0].fc.weight += 0.5   # 9 elements moved by 0.5: ||B-A|| = sqrt(9 * 0.25) = 1.5
        b.blocks[0].fc.bias += 0.5     # 3 more: the block's ||B-A|| = sqrt(12 * 0.25) = sqrt(3)
        b.embed.weight -= 1.0          # tied: head moves with it
    result = compare(a, b)
    unchanged = finding(result, "unchanged-tensor")
    assert unchanged.where == "blocks.1"
    assert "all 2 trainable tensors of blocks.1 (12 elements)" in unchanged.message
    row = result.tensors.set_index("name").loc["blocks.0.fc.weight"]
    # A's blocks.0.fc.weight is arange(9)/10 + 1: squares sum to 9 + 0.2 * 36 + 0.01 * 204 = 18.24
    assert row["status"] == "changed" and row["max_abs"] == pytest.approx(0.5)
    assert row["diff_norm"] == pytest.approx(1.5) and row["rel_change"] == pytest.approx(
        1.5 / math.sqrt(18.24)
    )
    mods = result.modules.set_index("module")
    assert mods.loc["blocks.1", "changed"] == 0 and mods.loc["blocks.0", "changed"] == 2
    assert mods.loc["blocks", "tensors"] == 4 and mods.loc["blocks", "diff_norm"] == pytest.approx(
        math.sqrt(3)
    )
    assert result.modules["module"].tolist()[:3] == ["embed", "blocks", "blocks.0"]  # model order


def test_tie_broken_and_tie_added():
    a = tiny()
    b = copy.deepcopy(a)
    b.head.weight = nn.Parameter(b.embed.weight.detach() + 1.0)
    broken = finding(compare(a, b), "tie-broken")
    assert broken.where == "embed.weight" and "different values" in broken.message
    added = finding(compare(b, a), "tie-added")
    assert added.where == "embed.weight" and "head.weight" in added.message


def test_a_file_that_stores_a_tie_once_keeps_it_and_one_with_two_values_breaks_it(tmp_path):
    a = tiny()
    save_model(a, str(tmp_path / "once.safetensors"))  # safetensors keeps one name of the tie
    result = compare(a, tmp_path / "once.safetensors")
    assert result.codes() == ["tie-stored-once"]
    # the name the file leaves out is held through the tie: neither counted nor shown as missing
    assert (result.facts["missing"], result.facts["stored_once"]) == (0, 1)
    assert "missing" not in set(result.tensors["status"]) and "stored-once" in set(result.tensors["status"])
    state = state_of(a)
    state["head.weight"] = state["head.weight"] + 1
    save_file(state, str(tmp_path / "two.safetensors"))
    result = compare(a, tmp_path / "two.safetensors")
    assert "tie-broken" in result.codes() and result.status_of("head.weight") == "changed"


@pytest.mark.parametrize("prefix", ["_orig_mod.", "module.", "model."])
def test_renamed_prefix_checkpoint_is_paired_under_the_mapping(tmp_path, prefix):
    a = tiny()
    path = tmp_path / "wrapped.pt"
    torch.save({prefix + k: v for k, v in state_of(a).items()}, path)
    result = compare(a, path)
    renamed = finding(result, "renamed")
    assert (
        f"adds the prefix {prefix!r} on 6 tensors" in renamed.message
        and "6 of them hold the same bits" in renamed.message
    )
    assert "missing" not in result.codes() and "extra" not in result.codes()
    assert dict(result.renamed)["blocks.1.fc.bias"] == prefix + "blocks.1.fc.bias"
    # the other way round: B drops the prefix
    assert "drops the prefix" in finding(compare(path, a), "renamed").message


def test_missing_extra_shape_and_nonfinite(tmp_path):
    a = tiny()
    state = state_of(a)
    del state["blocks.1.fc.bias"]
    state["extra.weight"] = torch.zeros(2)
    state["embed.weight"] = torch.zeros(5, 3)
    state["head.weight"] = torch.zeros(5, 3)
    state["blocks.0.fc.weight"][1, 1] = math.nan
    state["blocks.0.fc.weight"][2, 2] = math.inf
    torch.save(state, tmp_path / "b.pt")
    result = compare(a, tmp_path / "b.pt")
    by_code = {f.code: f for f in result.findings}
    assert by_code["missing"].where == "blocks.1.fc.bias"
    assert by_code["extra"].where == "extra.weight"
    assert [f.where for f in result.findings if f.code == "shape-changed"] == ["embed.weight", "head.weight"]
    assert "(4, 3) in Tiny but (5, 3)" in by_code["shape-changed"].message
    assert (
        by_code["nonfinite"].where == "blocks.0.fc.weight"
        and "holds 2 NaN/Inf" in by_code["nonfinite"].message
    )
    assert by_code["nonfinite"].severity == "error"


def test_float32_to_bfloat16_states_the_precision_lost(tmp_path):
    a = tiny()
    save_file({k: v.bfloat16() for k, v in state_of(a).items()}, str(tmp_path / "bf16.safetensors"))
    result = compare(a, tmp_path / "bf16.safetensors")
    f = finding(result, "dtype-changed")
    assert f.severity == "warning"
    assert "6 tensors are float32 in Tiny and bfloat16" in f.message
    assert "bfloat16 keeps 8 significant bits of float32's 24" in f.message
    assert "B is exactly A rounded to bfloat16" in f.message
    rel = result.tensors["rel_change"]
    assert (rel > 0).any() and (rel <= 2.0 ** -8).all()  # round to nearest: at most half of eps = 2^-7
    state = {k: v.bfloat16() for k, v in state_of(a).items()}
    state["blocks.1.fc.bias"] += 1
    save_file(state, str(tmp_path / "moved.safetensors"))
    assert "1 of them differ from A rounded" in finding(compare(a, tmp_path / "moved.safetensors"),
                                                         "dtype-changed").message


def test_two_distributed_checkpoint_folders(tmp_path):
    import torch.distributed.checkpoint as dcp

    a = tiny()
    b = copy.deepcopy(a)
    with torch.no_grad():
        b.blocks[1].fc.bias += 2.0
    for name, model in (("a", a), ("b", b)):
        dcp.save(state_of(model), checkpoint_id=str(tmp_path / name), no_dist=True)
    result = compare(tmp_path / "a", tmp_path / "b")
    assert result.a_kind == result.b_kind == "distributed checkpoint"
    assert result.tensors.loc[result.tensors["status"] == "changed", "name"].tolist() == ["blocks.1.fc.bias"]
    assert result.tensors.set_index("name").loc["blocks.1.fc.bias", "max_abs"] == pytest.approx(2.0)
    # a file holds every floating tensor as trainable: everything but blocks.1.fc.bias stayed. Only
    # blocks.0.fc.bias is odd (its kind, blocks.*.fc.bias, changed in block 1); the rest is a frozen set
    odd = finding(result, "unchanged-tensor")
    assert odd.where == "blocks.0.fc.bias" and odd.message.startswith("1 of 6 trainable tensors")
    frozen = finding(result, "unchanged-expected")
    assert "4 tensors form a frozen set" in frozen.message and "blocks.*.fc.weight" in frozen.message
    summary = "1 of 6 tensors changed; 5 unchanged: blocks.0, blocks.1.fc.weight, embed, head"  # natural
    assert result.facts["summary"] == summary


def test_bad_sources_are_named():
    with pytest.raises(InspectorError, match="nope.safetensors does not exist"):
        compare(tiny(), "nope.safetensors")
    with pytest.raises(InspectorError, match="cannot compare a int"):
        compare(tiny(), 3)  # type: ignore[arg-type]


def test_cli_compares_two_files_in_process(tmp_path, capsys):
    a = tiny()
    save_file(state_of(a), str(tmp_path / "a.safetensors"))
    state = state_of(a)
    state["blocks.0.fc.bias"] += 1
    save_file(state, str(tmp_path / "b.safetensors"))
    out = tmp_path / "c.json"
    assert (
        main(
            ["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors"), "--json", str(out)]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "1 of 6 tensors changed; 5 unchanged" in text and "unchanged-tensor" in text
    data = json.loads(out.read_text())
    assert data["facts"]["changed"] == 1
    assert {f["code"] for f in data["findings"]} == {"unchanged-tensor", "unchanged-expected"}
    assert main(["compare", str(tmp_path / "a.safetensors"), str(tmp_path / "none.pt")]) == 2
    assert "none.pt does not exist" in capsys.readouterr().err


def test_report_section_in_json_html_and_markdown(tmp_path):
    import jsonschema

    from inspector import build_report, load_model
    from inspector.report import load_schema

    loaded = load_model("sample:tiny-gpt2")
    assert build_report(loaded, ["compare"]).section("compare").status == "skipped"
    state = {k: v.detach().clone() for k, v in loaded.model.state_dict().items() if k != "lm_head.weight"}
    state["transformer.h.0.mlp.c_fc.weight"] += 0.1
    save_file(state, str(tmp_path / "ft.safetensors"))
    report = build_report(loaded, ["compare"], compare_with=str(tmp_path / "ft.safetensors"))
    section = report.section("compare")
    assert section.status == "ok" and section.facts["changed"] == 1 and section.facts["b"] == "ft.safetensors"
    assert "tie-stored-once" in {f.code for f in section.findings}
    jsonschema.validate(json.loads(report.to_json()), load_schema())
    assert "Compared with another model or checkpoint" in report.to_html()
    assert (
        "| transformer.h.0.mlp.c_fc.weight | transformer.h.0.mlp.c_fc.weight | changed |"
        in report.to_markdown()
    )
    out = tmp_path / "r.md"
    assert main(["report", "sample:tiny-gpt2", "--sections", "compare", "--compare-with",
                 str(tmp_path / "ft.safetensors"), "-o", str(out)]) == 0
    assert "unchanged-expected" in out.read_text()  # one layer: every unchanged kind is a frozen set


def test_a_folder_of_safetensors_shards_is_one_side(tmp_path):
    a = tiny()
    state = state_of(a)
    names = list(state)
    folder = tmp_path / "sharded"
    folder.mkdir()
    save_file({k: state[k] for k in names[:3]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({k: state[k] for k in names[3:]}, str(folder / "model-00002-of-00002.safetensors"))
    (folder / "config.json").write_text("{}")  # a Hugging Face folder: read as files, no model built
    result = compare(a, folder)
    assert result.b_kind == "safetensors (2 files, no index)"
    assert result.codes() == [] and result.facts["equal"] == 6
    save_file({names[0]: state[names[0]]}, str(folder / "model-extra.safetensors"))
    with pytest.raises(InspectorError, match=f"tensor {names[0]} is in both"):
        compare(a, folder)


def test_a_rename_that_is_no_prefix_is_found_by_equal_bits_but_not_for_constant_tensors():
    a = tiny()
    state = state_of(a)
    state["other.kernel"] = state.pop("blocks.1.fc.weight")  # arange values: one tensor only has them
    state["other.zeros"] = torch.zeros(3)
    with torch.no_grad():
        a.blocks[1].fc.bias.zero_()  # all zeros: equal bits say nothing about where it went
    state.pop("blocks.1.fc.bias")
    result = compare(a, state)
    renamed = finding(result, "renamed")
    assert renamed.where == "blocks.1.fc.weight" and "is other.kernel in state dict" in renamed.message
    assert dict(result.renamed) == {"blocks.1.fc.weight": "other.kernel"}
    assert [f.where for f in result.findings if f.code in ("missing", "extra")] == [
        "blocks.1.fc.bias",
        "other.zeros",
    ]


def test_corrupt_and_truncated_safetensors_are_named(tmp_path):
    a = tiny()
    save_file(state_of(a), str(tmp_path / "ok.safetensors"))
    data = (tmp_path / "ok.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:-8])
    with pytest.raises(
        InspectorError, match=r"cut.safetensors is not a readable safetensors file: tensor \S+ has shape"
    ):
        compare(a, tmp_path / "cut.safetensors")
    (tmp_path / "junk.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(InspectorError, match="junk.safetensors is not a readable safetensors file"):
        compare(tmp_path / "junk.safetensors", a)


class _TinyLM(nn.Module):
    """An embedding, one block and a final LayerNorm ``ln_f``, as a GPT stores them; untrained, so
    ``ln_f.weight`` is all ones and ``ln_f.bias`` all zeros."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.wte = nn.Embedding(16, 8)
        self.fc = nn.Linear(8, 8)
        self.ln_f = nn.LayerNorm(8)


def _saved(tmp_path, name: str, renames: dict[str, str], change: dict[str, float] | None = None) -> str:
    state = {renames.get(k, k): v.detach().clone() for k, v in _TinyLM().state_dict().items()}
    for k, v in (change or {}).items():
        state[k] = state[k] + v
    save_file(state, str(tmp_path / name))
    return str(tmp_path / name)


def test_a_lone_constant_tensor_under_another_name_is_one_tensor_renamed(tmp_path, capsys):
    a = _saved(tmp_path, "a.safetensors", {})
    b = _saved(tmp_path, "b.safetensors", {"ln_f.weight": "ln_final.weight"})
    result = compare(a, b)
    assert result.renamed == (("ln_f.weight", "ln_final.weight"),)
    assert [f.code for f in result.findings] == ["renamed"]  # no missing and extra warnings
    assert "ln_f.weight in a.safetensors is ln_final.weight in b.safetensors" in result.findings[0].message
    row = result.tensors.set_index("name").loc["ln_f.weight"]
    assert (row["name_b"], row["status"], row["bitwise_equal"]) == ("ln_final.weight", "equal", True)
    assert (result.facts["missing"], result.facts["extra"], result.facts["renamed"]) == (0, 0, 1)
    assert main(["compare", a, b, "--fail-on", "warning"]) == 0
    assert "0 only in A, 0 only in B, 1 renamed" in capsys.readouterr().out


def test_constant_tensors_are_not_paired_by_value_unless_each_side_has_one_lone_name(tmp_path):
    a = _saved(tmp_path, "a.safetensors", {})
    # two lone names a side, all ones and all zeros: not paired (a fresh LayerNorm could be any of them)
    both = compare(a, _saved(tmp_path, "b.safetensors", {"ln_f.weight": "ln_final.weight",
                                                          "ln_f.bias": "ln_final.bias"}))
    assert both.renamed == () and (both.facts["missing"], both.facts["extra"]) == (2, 2)
    # one lone name a side, but other bits: not the same tensor
    moved = compare(a, _saved(tmp_path, "c.safetensors", {"ln_f.weight": "ln_final.weight"},
                              {"ln_final.weight": 0.5}))
    assert moved.renamed == () and (moved.facts["missing"], moved.facts["extra"]) == (1, 1)
    assert {f.code for f in moved.findings} >= {"missing", "extra"}
    # one lone name a side, other shapes: not the same tensor either
    state = {k: v.detach().clone() for k, v in _TinyLM().state_dict().items()}
    state["ln_final.weight"] = torch.ones(4)
    del state["ln_f.weight"]
    save_file(state, str(tmp_path / "d.safetensors"))
    shaped = compare(a, str(tmp_path / "d.safetensors"))
    assert shaped.renamed == () and (shaped.facts["missing"], shaped.facts["extra"]) == (1, 1)
