"""torch.distributed.checkpoint folders in one process: the one the world of 2 saved (FSDP2, 2 files)."""

from __future__ import annotations

import pickle
import shutil

import pytest
import torch

from inspector import InspectorError, load_model
from inspector.__main__ import main
from inspector.distributed import dcp_listing
from sample_models.fsdp import build

SOURCE = "sample_models/fsdp.py:build"


def test_listing_names_every_tensor_and_its_pieces(world2):
    out, _ = world2
    table = dcp_listing(out / "dcp").set_index("name")
    # 18 parameters + the buffer scale; stem.weight (32, 32) in two 16-row pieces, one per rank
    assert len(table) == 19
    assert table.loc["stem.weight", ["shape", "numel", "pieces"]].tolist() == [(32, 32), 1024, 2]
    assert table.loc["stem.weight", "piece_shapes"] == "16x32@0,0 16x32@16,0"
    assert table.loc["stem.weight", "files"] == "__0_0.distcp, __1_0.distcp"
    assert table.loc["head.bias", "piece_shapes"] == "5@0 5@5"


def test_checkpoint_folder_loads_into_the_model_in_one_process(world2, capsys):
    out, _ = world2
    loaded = load_model(SOURCE, checkpoint=str(out / "dcp"))
    fresh = build()
    for (name, p), q in zip(loaded.model.named_parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(p, q + 1.0, msg=name)  # the worker added 1 before saving
    assert [f.code for f in loaded.findings] == ["distributed-checkpoint"]
    assert "19 tensors put together from 37 pieces in 2 files" in loaded.findings[0].message
    assert main(["checkpoint", str(out / "dcp")]) == 0
    assert "19 entries, 37 pieces in 2 files" in capsys.readouterr().out


def test_metadata_that_asks_to_run_code_is_refused(world2, tmp_path):
    out, _ = world2
    folder = tmp_path / "evil"
    shutil.copytree(out / "dcp", folder)
    (folder / ".metadata").write_bytes(pickle.dumps(shutil.rmtree))  # a global call on load
    with pytest.raises(InspectorError, match=r"evil/.metadata was refused: it asks to run shutil.rmtree"):
        load_model(SOURCE, checkpoint=str(folder))
    assert folder.exists()


def test_missing_rank_file_is_named(world2, tmp_path):
    out, _ = world2
    folder = tmp_path / "partial"
    shutil.copytree(out / "dcp", folder)
    (folder / "__1_0.distcp").unlink()
    with pytest.raises(InspectorError, match=r"__1_0.distcp \(holding stem.weight\) cannot be read"):
        load_model(SOURCE, checkpoint=str(folder))


def test_non_tensor_entries_are_listed_and_left_out_of_the_load(tmp_path, capsys):
    import torch.distributed.checkpoint as dcp

    model = build()
    state = dict(model.state_dict())
    with torch.no_grad():
        state = {k: v + 2.0 for k, v in state.items()}
    state["step"] = 7                                 # an optimizer step count
    state["meta"] = {"lr": 0.01, "name": "run-a"}     # flattened by DCP into meta.lr and meta.name
    folder = tmp_path / "with-extras"
    dcp.save(state, checkpoint_id=str(folder), no_dist=True)

    table = dcp_listing(folder).set_index("name")
    extras = table[table["kind"] == "bytes"]
    assert extras.index.tolist() == ["step", "meta.lr", "meta.name"]
    assert extras["pieces"].tolist() == [1, 1, 1] and extras["numel"].tolist() == [0, 0, 0]
    assert (table["kind"] == "tensor").sum() == 19

    loaded = load_model(SOURCE, checkpoint=str(folder))
    for (name, p), q in zip(loaded.model.named_parameters(), model.parameters(), strict=True):
        torch.testing.assert_close(p, q + 2.0, msg=name)
    found = {f.code: f for f in loaded.findings}
    assert "19 tensors put together from 19 pieces in 1 files" in found["distributed-checkpoint"].message
    assert found["checkpoint-non-tensor"].where == "step"
    assert "3 entries of with-extras are not tensors (first: step)" in found["checkpoint-non-tensor"].message
    assert "unexpected-key" not in found  # the extras are not offered to load_state_dict

    assert main(["checkpoint", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "22 entries" in text and "meta.name" in text


EXTRA_STATE_MODEL = '''
import torch
from torch import nn


class Calibrated(nn.Module):
    """A Linear(2, 2) with extra state: a tensor of calibration scales and a plain step counter."""

    def __init__(self, with_counter):
        super().__init__()
        self.lin = nn.Linear(2, 2)
        self.scales = torch.ones(2)
        self.with_counter = with_counter
        self.counter = 0

    def get_extra_state(self):
        return {"count": self.counter} if self.with_counter else self.scales

    def set_extra_state(self, state):
        if self.with_counter:
            self.counter = state["count"]
        else:
            self.scales = state

    def forward(self, x):
        return self.lin(x) * self.scales


def scales():
    torch.manual_seed(0)
    return nn.Sequential(Calibrated(False))


def counter():
    torch.manual_seed(0)
    return nn.Sequential(Calibrated(True))
'''


def test_extra_state_is_loaded_when_it_is_a_tensor_and_listed_when_it_is_not(tmp_path, monkeypatch):
    import torch.distributed.checkpoint as dcp

    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    (tmp_path / "calibrated.py").write_text(EXTRA_STATE_MODEL)
    source = f"{tmp_path / 'calibrated.py'}"

    # a tensor extra state is a tensor entry: put together and handed to set_extra_state
    model = load_model(f"{source}:scales").model
    model[0].scales = torch.tensor([2.0, 3.0])
    dcp.save(model.state_dict(), checkpoint_id=str(tmp_path / "scales"), no_dist=True)
    assert dcp_listing(tmp_path / "scales").set_index("name").loc["0._extra_state", "kind"] == "tensor"
    loaded = load_model(f"{source}:scales", checkpoint=str(tmp_path / "scales"))
    assert loaded.model[0].scales.tolist() == [2.0, 3.0]
    assert [f.code for f in loaded.findings] == ["distributed-checkpoint"]

    # a dict extra state is flattened by DCP into non-tensor entries: listed, left out, named
    model = load_model(f"{source}:counter").model
    model[0].counter = 5
    dcp.save(model.state_dict(), checkpoint_id=str(tmp_path / "counter"), no_dist=True)
    table = dcp_listing(tmp_path / "counter").set_index("name")
    assert table.loc["0._extra_state.count", "kind"] == "bytes"
    loaded = load_model(f"{source}:counter", checkpoint=str(tmp_path / "counter"))
    assert loaded.model[0].counter == 0
    codes = {f.code: f for f in loaded.findings}
    assert codes["checkpoint-non-tensor"].where == "0._extra_state.count"
    assert codes["missing-key"].where == "0._extra_state"
