"""Which side a comparison's argument is: :func:`open_source` picks the :class:`~.sources.TensorSource`
for a model, a state dict, a checkpoint file or folder (the sides of :mod:`.sources` and
:mod:`.folder_sides`, which build on them) and closes it afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from ..loading.checkpoints import read_checkpoint
from ..loading.dcp import is_dcp_folder
from ..loading.folders import folder_files
from ..loading.models import LoadedModel, load_model
from ..utils.findings import InspectorError
from ..utils.paths import file_kind
from .folder_sides import DcpSide, ShardedSafetensorsSide
from .sources import ModelSide, SafetensorsSide, StateDictSide, TensorSource

Spec = str | os.PathLike | LoadedModel | nn.Module | Mapping[str, torch.Tensor]


def _open(spec: Spec, device: str) -> TensorSource:
    if isinstance(spec, LoadedModel):
        return ModelSide(spec.name, spec.model, spec.findings)
    if isinstance(spec, nn.Module):
        return ModelSide(type(spec).__name__, spec)
    if isinstance(spec, Mapping):
        if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in spec.items()):
            raise InspectorError("a state dict to compare must map names (str) to tensors")
        return StateDictSide("state dict", spec)
    if not isinstance(spec, (str, os.PathLike)):
        raise InspectorError(
            f"cannot compare a {type(spec).__name__}: give a source ('sample:NAME', "
            "'FILE.py:factory', 'hf:DIR'), a checkpoint file or folder, a model or a state dict"
        )
    text = os.fspath(spec)
    if isinstance(text, str) and (text.startswith(("sample:", "hf:")) or ".py:" in text):
        loaded = load_model(text, device=device)
        return ModelSide(loaded.name, loaded.model, loaded.findings)
    path = Path(text).expanduser()
    if is_dcp_folder(path):
        return DcpSide(path)
    found = folder_files(path)
    if found is not None and found.safetensors:  # a checkpoint folder (a Hugging Face one too)
        return ShardedSafetensorsSide(path, found)
    if found is not None:
        state, findings = read_checkpoint(path, mmap=True)
        return StateDictSide(path.name, state, f"torch files ({found.how})", findings)
    if path.is_dir() and (path / "config.json").is_file():
        loaded = load_model(f"hf:{path}", device=device)
        return ModelSide(loaded.name, loaded.model, loaded.findings)
    special = file_kind(path)
    if special and special != "a folder":
        raise InspectorError(f"{path} is {special}, not a regular file; reading it could block or never end: "
                             "give a checkpoint file or folder")
    if not path.exists():
        raise InspectorError(
            f"{path} does not exist: give a source ('sample:NAME', 'FILE.py:factory', "
            "'hf:DIR'), a .safetensors/.pt/.bin file or a torch.distributed.checkpoint folder"
        )
    if path.suffix == ".safetensors" and path.is_file():
        return SafetensorsSide(path)
    if path.is_dir():
        raise InspectorError(
            f"{path} is a folder but neither a torch.distributed.checkpoint folder (no .metadata), "
            "a checkpoint folder (no .safetensors file, pytorch_model.bin or index) nor a Hugging Face "
            "model folder (no config.json)"
        )
    state, findings = read_checkpoint(path, mmap=True)
    return StateDictSide(path.name, state, "torch file", findings)


@contextmanager
def open_source(spec: Spec, device: str = "cpu") -> Iterator[TensorSource]:
    """One side of a comparison, closed afterwards.

    Args:
        spec: ``"sample:NAME"``, ``"FILE.py:factory"``, ``"hf:DIR"`` (the model built from the folder), a
            ``.safetensors``/``.pt``/``.bin`` file, a folder of ``.safetensors`` files (a sharded or
            Hugging Face checkpoint, read file by file without building a model), a
            ``torch.distributed.checkpoint`` folder, a ``LoadedModel``, an ``nn.Module`` or a state dict.
        device: where a model built from a source string is placed.

    Raises:
        InspectorError: the source is unknown, missing, corrupt or refused.
    """
    side = _open(spec, device)
    try:
        yield side
    finally:
        side.close()
