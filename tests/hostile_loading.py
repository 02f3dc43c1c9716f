"""Hostile files for loading, written into a test's folder: torch zip bombs, distributed
checkpoints whose index lies, Hugging Face folders that ask for too much or for code, model files
that change process-wide torch settings."""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import warnings
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

MODEL_FILE = '''
import torch
from torch import nn


def scripted():
    return torch.jit.script(nn.Sequential(nn.Linear(3, 2), nn.ReLU()))


def sparse_param():
    m = nn.Linear(3, 2)
    m.weight = nn.Parameter(torch.eye(2, 3).to_sparse())
    return m


def deep():
    m = nn.Linear(3, 2)
    for _ in range(2000):
        m = nn.Sequential(m)
    return m


def sets_globals():
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    return nn.Linear(3, 2)


class Rotary(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)
        self.register_buffer("freqs", torch.tensor([1 + 2j, -3 + 0.5j], dtype=torch.complex64))

    def forward(self, x):
        return self.fc(x)


def complex_buffer():
    return Rotary()


def example_inputs(batch_size):
    return torch.ones(batch_size, 3)
'''


def zip_bomb(path: Path, mebibytes: int = 16) -> None:
    """A torch zip file (one tensor of 3 floats) whose data entry inflates to ``mebibytes`` MiB of zeros."""
    plain = path.with_name(path.name + ".plain")
    torch.save({"fc.weight": torch.ones(3)}, plain)
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w") as out:
        for info in src.infolist():
            if info.filename.endswith("data/0"):
                entry = zipfile.ZipInfo(info.filename)
                entry.compress_type = zipfile.ZIP_DEFLATED
                with out.open(entry, "w", force_zip64=True) as fh:
                    chunk = bytes(1 << 20)
                    for _ in range(mebibytes):
                        fh.write(chunk)
            else:
                out.writestr(info, src.read(info.filename))
    plain.unlink()


def _dcp_save(folder: Path, state: dict) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)


def _edited(base: Path, folder: Path, change) -> None:
    from inspector.distributed import read_metadata

    shutil.copytree(base, folder)
    metadata = read_metadata(folder)
    change(metadata)
    (folder / ".metadata").write_bytes(pickle.dumps(metadata))


def _w_index(m):
    return next(k for k in m.storage_data if k.fqn == "w")


def _huge_piece(m):  # (40000, 40000) floats whose piece claims 2**40 bytes
    m.state_dict_metadata["w"].size = torch.Size([40000, 40000])
    m.state_dict_metadata["w"].chunks[0].sizes = torch.Size([40000, 40000])
    m.storage_data[_w_index(m)].length = 1 << 40


def _length_2_62(m):
    m.storage_data[_w_index(m)].length = 1 << 62


def _million_square(m):
    m.state_dict_metadata["w"].size = torch.Size([10**6, 10**6])


def _string_keys(m):
    m.storage_data["w"] = m.storage_data.pop(_w_index(m))


def _no_properties(m):
    del m.state_dict_metadata["w"].properties


def _no_chunks(m):
    del m.state_dict_metadata["w"].chunks


def _many_claims(m):  # 300 tensors that all claim the one stored piece of w
    index, info, entry = _w_index(m), m.storage_data[_w_index(m)], m.state_dict_metadata["w"]
    for i in range(300):
        m.state_dict_metadata[f"w{i}"] = entry
        m.storage_data[dataclasses.replace(index, fqn=f"w{i}")] = info


DCP_EDITS = {"huge-piece": _huge_piece, "length-2-62": _length_2_62, "million-square": _million_square,
             "string-keys": _string_keys, "no-properties": _no_properties, "no-chunks": _no_chunks,
             "many-claims": _many_claims}


def _hf_folder(root: Path, name: str, **config_changes) -> Path:
    """A saved one-layer GPT-2 (n_embd 16) whose config.json is then edited."""
    import transformers as tf

    folder = root / name
    base = root / "hf-base"
    if not base.exists():
        torch.manual_seed(0)
        tf.GPT2LMHeadModel(tf.GPT2Config(vocab_size=64, n_positions=32, n_embd=16, n_layer=1, n_head=2,
                                         bos_token_id=0, eos_token_id=0)).save_pretrained(base)
    shutil.copytree(base, folder)
    config = json.loads((folder / "config.json").read_text())
    for key, value in config_changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _index_outside(root: Path, name: str, target: str) -> Path:
    folder = _hf_folder(root, name)
    keys = list(json.loads((folder / "model.safetensors").read_bytes()[8:8 + int.from_bytes(
        (folder / "model.safetensors").read_bytes()[:8], "little")]))
    (folder / "model.safetensors").unlink()
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: target for k in keys if k != "__metadata__"}}))
    return folder


def write_loading_files(root: Path) -> None:
    """Every hostile loading file under ``root`` (a few tenths of a second)."""
    (root / "models" / "loading.py").write_text(MODEL_FILE)
    zip_bomb(root / "bomb.pt")
    dcp_base = root / "dcp-base"
    _dcp_save(dcp_base, {"w": torch.arange(8.0).reshape(4, 2), "b": torch.ones(3)})
    for name, change in DCP_EDITS.items():
        _edited(dcp_base, root / f"dcp-{name}", change)
    _hf_folder(root, "hf-million-layers", n_layer=1_000_000)
    _hf_folder(root, "hf-kernel", _attn_implementation="kernels-community/flash-attn")
    _hf_folder(root, "hf-sub-kernel", text_config={"attn_implementation": "evil/repo@main:fn"})
    _hf_folder(root, "hf-quant-kernel", quantization_config={"quant_method": "mxfp4"})
    _hf_folder(root, "hf-experts-kernel", _experts_implementation="sonicmoe")
    _hf_folder(root, "hf-arch-string", architectures="GPT2LMHeadModel")
    outside = root / "outside-weights"
    outside.mkdir()
    shutil.copy(root / "hf-base" / "model.safetensors", outside / "model.safetensors")
    bomb_folder = _hf_folder(root, "hf-bomb")
    (bomb_folder / "model.safetensors").unlink()
    zip_bomb(bomb_folder / "pytorch_model.bin")
    _index_outside(root, "hf-index-up", "../outside-weights/model.safetensors")
    _index_outside(root, "hf-index-absolute", str(outside / "model.safetensors"))
    torch.save(
        {"fc.weight": torch.eye(2, 3).to_sparse(), "fc.bias": torch.full((2,), 7.0)}, root / "sparse.pt"
    )
    torch.save(
        {"fc.bias": torch.full((2,), 7.0), "fc.weight": torch.empty(2, 3, device="meta")}, root / "meta.pt"
    )
    torch.save({"fc.weight": torch.ones(2, 3), "fc.bias": torch.ones(2), "bad\ud800key": torch.ones(1)},
               root / "surrogate.pt")
    save_file({"x.weight": torch.ones(1)}, str(root / "unrelated.safetensors"))
    save_file({"fc.weight": torch.ones(2, 3), "fc.bias": torch.ones(2)}, str(root / "UPPER.SAFETENSORS"))
    weird = os.fsdecode(b"w\xff")
    torch.save({"fc.weight": torch.ones(2, 3), "fc.bias": torch.ones(2)}, root / f"{weird}.pt")
    save_file({"fc.weight": torch.ones(2, 3), "fc.bias": torch.ones(2)}, str(root / f"{weird}.safetensors"))
    model = nn.Linear(3, 2)
    optim = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optim.step()
    with torch.no_grad():
        model.weight.fill_(5.0)
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optim)
    _dcp_save(
        root / "dcp-tutorial", {"model": {f"fc.{k}": v for k, v in msd.items()}, "optim": osd, "step": 3}
    )
