"""Which files of a checkpoint folder hold its tensors: a sharded Hugging Face folder through its index
(``model.safetensors.index.json``, ``pytorch_model.bin.index.json``), else its one weights file, else
every ``.safetensors`` file. A ``torch.distributed.checkpoint`` folder is read elsewhere (:mod:`.dcp`)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..utils.findings import InspectorError

INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
SINGLE_FILES = ("model.safetensors", "pytorch_model.bin", "consolidated.safetensors")


@dataclass(frozen=True)
class FolderFiles:
    """The weight files of one folder, in order; ``owner``: tensor name -> file, from the index
    (empty when there is none: every tensor of the files counts); ``how``: how they were chosen."""

    files: tuple[Path, ...]
    how: str
    owner: dict[str, Path] = field(default_factory=dict)

    @property
    def safetensors(self) -> bool:
        return all(f.suffix == ".safetensors" for f in self.files)


def _natural(name: str) -> list[tuple[int, int | str]]:
    return [(0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p]


def _from_index(folder: Path, index: Path) -> FolderFiles:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        weight_map = data["weight_map"]
        if not isinstance(weight_map, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
            raise TypeError("weight_map is not a map of names to file names")
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise InspectorError(f"{index} is not a readable checkpoint index ({type(exc).__name__}: {exc}); "
                             "it must hold a 'weight_map' of tensor names to file names. Fix or remove it"
                             ) from None
    owner: dict[str, Path] = {}
    for name, file in weight_map.items():
        path = folder / file
        if Path(file).name != file or not path.is_file():
            raise InspectorError(f"{index.name} stores tensor {name} in {file!r}, which is not a file of "
                                 f"{folder}; the folder is incomplete (copy every shard) or the index is "
                                 "wrong")
        owner[name] = path
    files = tuple(dict.fromkeys(sorted(owner.values(), key=lambda p: _natural(p.name))))
    return FolderFiles(files, f"{index.name}: {len(files)} files, {len(owner)} tensors", owner)


def folder_files(path: str | os.PathLike) -> FolderFiles | None:
    """The weight files of a checkpoint folder (None when ``path`` is no folder or holds none).

    Raises:
        InspectorError: the index is unreadable or names a file the folder lacks.
    """
    folder = Path(path)
    if not folder.is_dir():
        return None
    for name in INDEX_FILES:
        if (folder / name).is_file():
            return _from_index(folder, folder / name)
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if len(indexes) == 1:
        return _from_index(folder, indexes[0])
    for name in SINGLE_FILES:
        if (folder / name).is_file():
            return FolderFiles((folder / name,), name)
    shards = sorted(folder.glob("*.safetensors"), key=lambda f: _natural(f.name))
    if shards:
        return FolderFiles(tuple(shards), f"{len(shards)} files, no index")
    return None
