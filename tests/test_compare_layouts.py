"""compare and checkpoint on every checkpoint layout: sharded Hugging Face folders read through their
index, plain ones, training-state .pt files under their wrapper keys, and DCP folders (ties, optimizer)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from inspector import InspectorError, checkpoint_listing, compare
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
    save_file({f"layers.{i}.w": torch.ones(2) for i in range(21)}, str(folder / "shards" / "consolidated.safetensors"))
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
