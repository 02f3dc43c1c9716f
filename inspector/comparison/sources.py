"""The two sides of a comparison: models, state dicts and checkpoints read one tensor at a time.

A :class:`TensorSource` lists every tensor's name, shape, dtype and device without reading its
values, and reads one tensor (or streams its raw values in chunks) when asked. A ``.safetensors``
file is streamed chunk by chunk into one reused buffer (nothing is memory-mapped, so a process
holds a chunk per side, and a whole tensor only where the dtypes differ); a
``torch.distributed.checkpoint`` folder is put together one tensor at a time from its pieces;
a torch ``.pt/.bin`` zip file is memory-mapped by ``torch.load(weights_only=True, mmap=True)``.
Nothing in a checkpoint is ever executed: the readers are the loader's own.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ..loading.listing import SAFETENSORS_DTYPE_NAMES
from ..utils.findings import Finding, InspectorError
from ..utils.labels import natural_key
from .kernels import CHUNK, raw_values


@dataclass(frozen=True)
class Meta:
    """What a side knows about one tensor before reading it."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: str


@dataclass
class TensorSource:
    """One side of a comparison (built by :func:`open_source`).

    ``entries``: name -> :class:`Meta`, in the source's order; ``ties``: groups of names that are
    one tensor here (same object or same storage); ``trainable``: names that training would
    change (a model's ``requires_grad`` parameters; every floating tensor of a file);
    ``is_model``: whether ties can be expressed here (a file may store a tie once);
    ``state_names``: entries of a training checkpoint that are not the model's (optimizer state,
    extras), compared only with the same names of another training checkpoint.
    """

    label: str
    kind: str
    entries: dict[str, Meta]
    ties: list[tuple[str, ...]] = field(default_factory=list)
    trainable: frozenset[str] = frozenset()
    is_model: bool = False
    findings: list[Finding] = field(default_factory=list)
    streams: bool = False  # chunks come from a file, so reading ahead pays
    state_names: frozenset[str] = frozenset()  # a training checkpoint's optimizer state and extras

    def read(self, name: str) -> torch.Tensor:
        """The tensor ``name`` on the CPU; valid until the next ``read`` of this side."""
        raise NotImplementedError

    def display_order(self) -> list[str]:
        """The names in the order tables show them: a model's own order; a file's names sorted with
        their numbers as numbers (``h.2`` before ``h.10``), since files keep no model order."""
        return list(self.entries)

    def prefetch(self, name: str) -> None:
        """Ask the system to start reading ``name`` from the disk (into its page cache, not into this
        process) while the caller works on something else; a hint only."""

    def chunks(self, name: str) -> Iterator[np.ndarray]:
        """The raw values of ``name`` (:func:`raw_values`), ``CHUNK`` elements at a time; each chunk is
        valid until the next one is taken."""
        raw = raw_values(self.read(name))
        for start in range(0, raw.size, CHUNK):
            yield raw[start:start + CHUNK]

    def close(self) -> None:
        """Release open files."""


class ModelSide(TensorSource):
    """The tensors of a model in memory (its state dict names, aliases included)."""

    def __init__(self, label: str, model: nn.Module, findings: list[Finding] | None = None) -> None:
        from ..aliases import alias_groups
        from ..inventory import tensor_inventory

        self._tensors: dict[str, torch.Tensor] = {}
        trainable = set()
        for e in tensor_inventory(model).entries:
            if e.kind == "buffer" and e.attr in model.get_submodule(e.module)._non_persistent_buffers_set:
                continue  # never saved in a state dict, so never in a checkpoint
            self._tensors[e.name] = e.tensor
            if e.kind == "parameter" and e.requires_grad and e.tensor.is_floating_point():
                trainable.add(e.name)
        entries = {n: Meta(tuple(t.shape), t.dtype, str(t.device)) for n, t in self._tensors.items()}
        ties = [tuple(n for n in g.names if n in entries) for g in alias_groups(model)
                if g.kind in ("same-object", "shared-storage")]
        super().__init__(label, "model", entries, [t for t in ties if len(t) > 1], frozenset(trainable),
                         True, list(findings or []))

    def read(self, name: str) -> torch.Tensor:
        from ..utils.dtensors import is_dtensor

        t = self._tensors[name].detach()
        if is_dtensor(t):  # a sharded parameter: gathered whole (a collective: every rank must compare)
            t = t.full_tensor()
        if t.device.type == "meta":
            raise InspectorError(f"{self.label}: tensor {name} is on the meta device (no values); load the "
                                 "model with a checkpoint on a real device to compare values")
        return t.cpu() if t.device.type != "cpu" else t


class StateDictSide(TensorSource):
    """A dict of names to tensors (a state dict in memory, or a torch file's)."""

    def __init__(self, label: str, state: Mapping[str, torch.Tensor], kind: str = "state dict",
                 findings: list[Finding] | None = None) -> None:
        self._tensors = dict(state)
        entries = {n: Meta(tuple(t.shape), t.dtype, str(t.device)) for n, t in self._tensors.items()}
        super().__init__(label, kind, entries, _shared_storage_groups(self._tensors),
                         frozenset(n for n, t in self._tensors.items() if t.is_floating_point()),
                         False, list(findings or []))

    def read(self, name: str) -> torch.Tensor:
        t = self._tensors[name].detach()
        return t.cpu() if t.device.type != "cpu" else t


def _shared_storage_groups(state: Mapping[str, torch.Tensor]) -> list[tuple[str, ...]]:
    """Names whose tensors are one stretch of one storage (``torch.save`` keeps a tie that way)."""
    by_key: dict[tuple, list[str]] = {}
    for name, t in state.items():
        if t.layout != torch.strided or t.device.type == "meta":
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
        by_key.setdefault(key, []).append(name)
    return [tuple(v) for v in by_key.values() if len(v) > 1]


class SafetensorsSide(TensorSource):
    """A ``.safetensors`` file: its header parsed and checked, each tensor read into a reused buffer."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fh = open(path, "rb", buffering=0)  # noqa: SIM115 - closed by close()
        except OSError as exc:
            raise InspectorError(f"checkpoint {path} cannot be read: {exc}") from None
        try:
            entries, self._offsets = _safetensors_header(path, self._fh)
        except BaseException:
            self._fh.close()
            raise
        self._buffer = torch.empty(0, dtype=torch.uint8)
        self._chunk = torch.empty(0, dtype=torch.uint8)
        super().__init__(path.name, "safetensors", entries, [],
                         frozenset(n for n, m in entries.items() if m.dtype.is_floating_point), streams=True)

    def display_order(self) -> list[str]:
        return sorted(self.entries, key=natural_key)

    def read(self, name: str) -> torch.Tensor:
        start, end = self._offsets[name]
        if self._buffer.numel() < end - start:
            self._buffer = torch.empty(end - start, dtype=torch.uint8)
        view = self._buffer[: end - start]
        self._fh.seek(start)
        got = self._fh.readinto(view.numpy().data)
        if got != end - start:
            raise InspectorError(f"checkpoint {self.path.name}: tensor {name} ends past the end of the file; "
                                 "the file is truncated")
        meta = self.entries[name]
        return view.view(meta.dtype).view(meta.shape)

    def chunks(self, name: str) -> Iterator[np.ndarray]:
        """Read straight from the file, one chunk at a time into a ring of ``RING`` reused buffers (a
        chunk stays valid while the next two are read ahead): the tensor is never whole in memory."""
        start, end = self._offsets[name]
        meta = self.entries[name]
        step = CHUNK * meta.dtype.itemsize
        if self._chunk.numel() < RING * min(step, end - start):
            self._chunk = torch.empty(RING * min(step, end - start), dtype=torch.uint8)
        ring = self._chunk.numpy().reshape(RING, -1)
        element = raw_values(torch.empty(0, dtype=meta.dtype)).dtype
        for i, pos in enumerate(range(start, end, step)):
            n = min(step, end - pos)
            view = ring[i % RING, :n]
            if os.preadv(self._fh.fileno(), [view.data], pos) != n:
                raise InspectorError(
                    f"checkpoint {self.path.name}: tensor {name} ends past the end of the file; "
                    "the file is truncated"
                )
            yield view.view(element)

    def prefetch(self, name: str) -> None:
        start, end = self._offsets[name]
        if end > start and hasattr(os, "posix_fadvise"):
            os.posix_fadvise(self._fh.fileno(), start, end - start, os.POSIX_FADV_WILLNEED)

    def close(self) -> None:
        self._fh.close()


def _safetensors_header(path: Path, fh: Any) -> tuple[dict[str, Meta], dict[str, tuple[int, int]]]:
    """Entries and absolute byte ranges from a safetensors header, every range checked against the file."""
    size = os.fstat(fh.fileno()).st_size
    bad = f"checkpoint {path.name} is not a readable safetensors file"
    head = fh.read(8)
    length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
    if not 0 < length <= min(size - 8, 100 << 20):
        raise InspectorError(f"{bad} (its header length is wrong); re-save it with safetensors")
    try:
        header = json.loads(fh.read(length))
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise InspectorError(f"{bad} (its header is not JSON); re-save it with safetensors") from None
    if not isinstance(header, dict):
        raise InspectorError(f"{bad} (its header is not a JSON object); re-save it with safetensors")
    entries: dict[str, Meta] = {}
    offsets: dict[str, tuple[int, int]] = {}
    base = 8 + length
    for name, info in sorted(((k, v) for k, v in header.items() if k != "__metadata__"),
                             key=lambda kv: _first_offset(kv[1])):
        try:
            dtype = getattr(torch, SAFETENSORS_DTYPE_NAMES[info["dtype"]])
            shape = tuple(int(n) for n in info["shape"])
            start, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
            raise InspectorError(f"{bad}: the header entry of tensor {name} is invalid") from None
        if min(shape, default=0) < 0 or end - start != math.prod(shape) * dtype.itemsize or start < 0 \
                or base + end > size:
            raise InspectorError(f"{bad}: tensor {name} has shape {shape} but bytes {start}..{end} "
                                 f"(the file has {size - base} data bytes); the file is corrupt")
        entries[name] = Meta(shape, dtype, "cpu")
        offsets[name] = (base + start, base + end)
    return entries, offsets


def _first_offset(info: Any) -> int:
    try:
        return int(info["data_offsets"][0])
    except (KeyError, TypeError, ValueError, IndexError, OverflowError):
        return -1


RING = 3
