"""Which files of a checkpoint folder hold its tensors: a sharded Hugging Face folder through its index
(``model.safetensors.index.json``, ``pytorch_model.bin.index.json``), else its one weights file, else
every ``.safetensors`` file. A ``torch.distributed.checkpoint`` folder is read elsewhere (:mod:`.dcp`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from ..utils.findings import InspectorError
from ..utils.labels import natural_key
from ..utils.paths import file_kind

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

    def assign(self, names_by_file: Iterable[tuple[Path, Iterable[str]]], folder: str) -> dict[str, Path]:
        """Which file each tensor is read from (name -> file, in the order given): ``names_by_file``
        gives each of :attr:`files` with the tensor names it holds (it may read them one file at a
        time); a name the index stores in another file is not that file's. ``folder``: the name
        messages give the folder.

        Raises:
            InspectorError: a tensor is in two files, or the index stores tensors in files that do
                not hold them.
        """
        held: dict[str, Path] = {}
        for file, names in names_by_file:
            for name in names:
                if self.owner and self.owner.get(name) != file:
                    continue  # the index stores it elsewhere (or not at all): not this file's
                if name in held:
                    raise InspectorError(
                        f"{folder}: tensor {name} is in both {held[name].name} and {file.name}; a checkpoint "
                        "folder holds each tensor once (or names the file of each in its index)")
                held[name] = file
        lost = [n for n in self.owner if n not in held]
        if lost:
            raise InspectorError(f"{folder}: the index stores {len(lost)} tensors in files that do not hold "
                                 f"them (first: {lost[0]} in {self.owner[lost[0]].name}); the folder's "
                                 "shards and index do not match")
        return held


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
    root = folder.resolve()
    for name, file in weight_map.items():
        path = folder / file
        if Path(file).name != file or not os.path.lexists(path):
            raise InspectorError(f"{index.name} stores tensor {name} in {file!r}, which is not a file of "
                                 f"{folder}; the folder is incomplete (copy every shard) or the index is "
                                 "wrong")
        _inside(path, root, index, file)
        owner[name] = path
    files = tuple(dict.fromkeys(sorted(owner.values(), key=lambda p: natural_key(p.name))))
    return FolderFiles(files, f"{index.name}: {len(files)} files, {len(owner)} tensors", owner)


def _inside(path: Path, root: Path, index: Path, file: str) -> None:
    """A shard an index names stays in its folder once symlinks resolve, and is a regular file."""
    try:
        target = path.resolve()
    except (OSError, RuntimeError):  # a symlink loop
        target = None
    if target is None or not target.is_relative_to(root):
        raise InspectorError(f"{index.name} names the shard {file!r}, a link that leads outside {root}; "
                             "every shard must be a file inside the checkpoint folder: copy it in")
    special = file_kind(target)
    if special:
        raise InspectorError(f"{index.name} names the shard {file!r}, which is {special}, not a regular "
                             "file; every shard must be a file of the checkpoint folder")


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
    shards = sorted(folder.glob("*.safetensors"), key=lambda f: natural_key(f.name))
    if shards:
        return FolderFiles(tuple(shards), f"{len(shards)} files, no index")
    return None
