"""Sides read from checkpoint folders: a folder of ``.safetensors`` shards (through its index), and a
``torch.distributed.checkpoint`` folder (a training checkpoint as its model part)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..loading.dcp import dcp_index, read_dcp_tensor
from ..loading.folders import FolderFiles
from ..loading.training_state import training_parts
from ..utils.findings import Finding
from ..utils.labels import natural_key
from .sources import Meta, SafetensorsSide, TensorSource


class ShardedSafetensorsSide(TensorSource):
    """A folder of ``.safetensors`` files (a sharded Hugging Face checkpoint): one side, each tensor read
    from the file that holds it (the one its index names), the files never loaded whole."""

    def __init__(self, path: Path, found: FolderFiles) -> None:
        self.path = path
        self._shards: list[SafetensorsSide] = []
        by_file: dict[Path, SafetensorsSide] = {}

        def open_each() -> Iterator[tuple[Path, Iterable[str]]]:
            for f in found.files:
                by_file[f] = shard = SafetensorsSide(f)
                self._shards.append(shard)
                yield f, shard.entries

        try:
            held = found.assign(open_each(), path.name)
        except BaseException:
            self.close()
            raise
        self._owner = {name: by_file[f] for name, f in held.items()}
        entries = {n: m for shard in self._shards for n, m in shard.entries.items() if n in self._owner
                   and self._owner[n] is shard}
        super().__init__(path.name, f"safetensors ({found.how})", entries, [],
                         frozenset(n for n, m in entries.items() if m.dtype.is_floating_point), streams=True)

    def display_order(self) -> list[str]:
        return sorted(self.entries, key=natural_key)

    def read(self, name: str) -> torch.Tensor:
        return self._owner[name].read(name)

    def chunks(self, name: str) -> Iterator[np.ndarray]:
        return self._owner[name].chunks(name)

    def prefetch(self, name: str) -> None:
        self._owner[name].prefetch(name)

    def close(self) -> None:
        for shard in self._shards:
            shard.close()


class DcpSide(TensorSource):
    """A ``torch.distributed.checkpoint`` folder: each tensor put together from its pieces when read. A
    training checkpoint (``{"model": ..., "optim": ..., "step": ...}``) is its model part, under the
    model's own names, plus its optimizer state and extras under their full names (``state_names``:
    compared only against another training checkpoint's); a finding lists them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._entries, self._pieces = dcp_index(path)
        self._handles: dict[str, Any] = {}
        parts = training_parts({n: e.kind == "tensor" for n, e in self._entries.items()})
        strip = parts.model + "." if parts else ""
        tensors = [n for n, e in self._entries.items() if e.kind == "tensor" and e.dtype is not None]
        self._full = {n[len(strip):]: n for n in tensors if n.startswith(strip)}
        model = frozenset(self._full)
        state = [n for n in tensors if not n.startswith(strip) and n not in model]
        self._full.update((n, n) for n in state)
        entries = {name: Meta(self._entries[full].shape, self._entries[full].dtype, "cpu")  # type: ignore[arg-type]
                   for name, full in self._full.items()}
        findings = [Finding("checkpoint-part", "info", path.name, parts.describe(path.name, len(model)))
                    ] if parts else []
        super().__init__(path.name, "distributed checkpoint" + (", training state" if parts else ""), entries,
                         [], frozenset(n for n in model if entries[n].dtype.is_floating_point),
                         findings=findings, state_names=frozenset(state))

    def display_order(self) -> list[str]:
        return sorted(self.entries, key=natural_key)

    def read(self, name: str) -> torch.Tensor:
        full = self._full[name]
        return read_dcp_tensor(self.path, self._entries[full], self._pieces.get(full, []), self._handles)

    def close(self) -> None:
        for fh in self._handles.values():
            fh.close()
        self._handles.clear()
