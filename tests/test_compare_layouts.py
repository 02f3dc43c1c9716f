"""compare and checkpoint on every checkpoint layout: sharded Hugging Face folders read through their
index, plain ones, training-state .pt files under their wrapper keys, and DCP folders (ties, optimizer)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from inspector import InspectorError, checkpoint_listing, compare, read_checkpoint
from inspector.__main__ import main


def tiny_llama(tied: bool = False):
    """2 layers, hidden 64 (q/k/v/o 64x64 with 1 kv head: k, v 64x32), vocabulary 128: 21 tensors
    (embed, 2 x 9 per layer, final norm, lm_head unless tied)."""
    import transformers as tf

    torch.manual_seed(0)
    config = tf.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
                            tie_word_embeddings=tied)
    return tf.LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """The same Llama saved whole and in 40 KB shards with an index, plus a consolidated.safetensors
    (other names, as Mistral folders hold) next to the shards."""
    folder = tmp_path_factory.mktemp("llama")
    model = tiny_llama()
    model.save_pretrained(folder / "whole")
    model.save_pretrained(folder / "shards", max_shard_size="40KB")
    other = {f"layers.{i}.w": torch.ones(2) for i in range(21)}
    save_file(other, str(folder / "shards" / "consolidated.safetensors"))
    return folder, model


def test_a_sharded_folder_is_read_through_its_index(sharded):
    folder, model = sharded
    index = json.loads((folder / "shards" / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 2  # really sharded
    result = compare(folder / "whole", folder / "shards")
    assert result.facts["extra"] == 0 and result.facts["missing"] == 0  # consolidated.safetensors is not read
    assert result.facts["compared"] == len(index["weight_map"]) == 21
    assert result.facts["equal"] == 21 and result.codes() == []
    assert result.b_kind == f"safetensors (model.safetensors.index.json: {len(files)} files, 21 tensors)"
    assert compare(model, folder / "shards").facts["equal"] == 21


def test_reading_listing_and_comparing_a_folder_refuse_the_same_mismatches(tmp_path):
    # two shards without an index both hold "b": each reader names both files
    twice = tmp_path / "twice"
    twice.mkdir()
    save_file({"a": torch.zeros(2), "b": torch.ones(2)}, str(twice / "part-1.safetensors"))
    save_file({"b": torch.ones(2)}, str(twice / "part-2.safetensors"))
    # an index that stores "c" in a shard that does not hold it
    lost = tmp_path / "lost"
    lost.mkdir()
    save_file({"a": torch.zeros(2)}, str(lost / "part-1.safetensors"))
    (lost / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "part-1.safetensors", "c": "part-1.safetensors"}}))
    cases = [(twice, "twice: tensor b is in both part-1.safetensors and part-2.safetensors; "),
             (lost, "lost: the index stores 1 tensors in files that do not hold them (first: c in "
                    "part-1.safetensors)")]
    for folder, message in cases:
        for read in (read_checkpoint, checkpoint_listing, lambda f: compare(f, f)):
            with pytest.raises(InspectorError) as caught:
                read(folder)
            assert message in str(caught.value)


def test_checkpoint_lists_sharded_and_plain_folders(sharded, capsys):
    folder, _ = sharded
    table, findings = checkpoint_listing(folder / "shards")
    assert len(table) == 21 and "lm_head.weight" in set(table["name"])
    assert "model.safetensors.index.json" in findings[0].message
    assert main(["checkpoint", str(folder / "whole")]) == 0
    assert "21 tensors" in capsys.readouterr().out
    assert main(["checkpoint", str(folder)]) == 2  # a folder of folders holds no checkpoint
    assert "no .safetensors file, pytorch_model.bin or index" in capsys.readouterr().err


def test_an_index_that_names_a_missing_shard_is_bad_input(sharded, tmp_path, capsys):
    folder, _ = sharded
    bad = tmp_path / "bad"
    bad.mkdir()
    index = json.loads((folder / "shards" / "model.safetensors.index.json").read_text())
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(InspectorError, match="not a file of .*the folder is incomplete"):
        compare(folder / "whole", bad)
    assert main(["compare", str(folder / "whole"), str(bad)]) == 2
    assert main(["checkpoint", str(bad)]) == 2
    assert "the folder is incomplete" in capsys.readouterr().err


@pytest.mark.parametrize("key", ["model", "module", "state_dict", "model_state_dict"])
def test_training_pt_files_are_read_under_their_wrapper_key_and_say_which(tmp_path, key, capsys):
    model = tiny_llama()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    torch.save({key: state, "optimizer": {"lr": 0.1}, "epoch": 3}, tmp_path / "train.pt")
    result = compare(model, tmp_path / "train.pt")
    assert result.facts["equal"] == 21 and result.facts["extra"] == 0
    nested = [f for f in result.findings if f.code == "checkpoint-nested"]
    assert len(nested) == 1 and f"under key {key!r} of train.pt" in nested[0].message
    assert main(["compare", str(tmp_path / "train.pt"), str(tmp_path / "train.pt")]) == 0
    assert f"under key {key!r}" in capsys.readouterr().out


def _dcp_save(state, folder) -> None:
    import warnings

    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)


def test_a_tied_model_in_dcp_against_its_safetensors_folder_has_no_false_extra(tmp_path):
    model = tiny_llama(tied=True)
    model.save_pretrained(tmp_path / "hf")  # stores the tie once: no lm_head.weight
    _dcp_save({k: v.detach().clone() for k, v in model.state_dict().items()}, tmp_path / "dcp")  # both names
    result = compare(tmp_path / "hf", tmp_path / "dcp")
    assert result.facts["extra"] == 0 and result.status_of("lm_head.weight") == "stored-once"
    tie = [f for f in result.findings if f.code == "tie-stored-once"]
    assert len(tie) == 1
    assert "holds model.embed_tokens.weight and lm_head.weight with the same bits" in tie[0].message
    back = compare(tmp_path / "dcp", tmp_path / "hf")
    assert back.facts["missing"] == 0 and back.status_of("lm_head.weight") == "stored-once"


def test_a_training_state_dcp_folder_is_model_plus_optimizer_plus_extras(tmp_path):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model = tiny_llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.arange(8)[None], labels=torch.arange(8)[None]).loss.backward()
    opt.step()
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd, "step": 1, "extra": {"rng": torch.get_rng_state()}}
    _dcp_save(state, tmp_path / "ts")
    result = compare(model, tmp_path / "ts")
    assert result.b_kind == "distributed checkpoint, training state"
    assert result.facts["extra"] == 0 and result.facts["missing"] == 0 and result.facts["equal"] == 21
    part = [f for f in result.findings if f.code == "checkpoint-part"]
    # AdamW: step, exp_avg, exp_avg_sq per parameter (21 x 3 = 63) plus 12 param_group entries
    assert len(part) == 1
    assert "optimizer state: optim (75 entries); extras: step (1), extra (1)" in part[0].message
    # two training states: their models compared name by name
    with torch.no_grad():
        model.model.norm.weight += 1
    msd, osd = get_state_dict(model, opt)
    _dcp_save({"model": msd, "optim": osd, "step": 2}, tmp_path / "ts2")
    two = compare(tmp_path / "ts", tmp_path / "ts2")
    assert two.tensors.loc[two.tensors["status"] == "changed", "name"].tolist() == ["model.norm.weight"]
    # their optimizer states (63 tensors: step, exp_avg, exp_avg_sq of 21 parameters) are compared too;
    # extra.rng, in ts only, is neither missing nor counted
    assert two.facts["state_compared"] == 63 and two.facts["state_changed"] == 0
    assert two.facts["summary"].startswith("1 of 21 tensors changed") and two.facts["missing"] == 0
    assert two.status_of("optim.state.model.norm.weight.exp_avg") == "equal"


def test_read_checkpoint_takes_a_sharded_folder_as_apply_checkpoint_does(sharded):
    from inspector.loading import apply_checkpoint, read_checkpoint

    folder, model = sharded
    state, findings = read_checkpoint(folder / "shards")
    assert len(state) == 21 and findings[0].code == "checkpoint-folder"
    fresh = tiny_llama()
    with torch.no_grad():
        for p in fresh.parameters():
            p.zero_()
    apply_checkpoint(fresh, folder / "shards")
    assert compare(model, fresh).facts["equal"] == 21
