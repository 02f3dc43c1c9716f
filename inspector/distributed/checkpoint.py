"""``torch.distributed.checkpoint`` folders read in one process, without running code from them.

A sharded job saves one ``.distcp`` file per rank plus a pickled ``.metadata`` index. torch's
own reader unpickles ``.metadata`` with ``pickle.load``; here it goes through an unpickler
that only builds the checkpoint's own metadata classes, and every tensor piece is read with
``torch.load(weights_only=True)``. Pieces are put together into whole tensors on the CPU, so a
sharded job's checkpoint can be inspected and loaded into the model on a laptop.
"""

from __future__ import annotations

import io
import math
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ..findings import Finding, InspectorError

METADATA = ".metadata"
_METADATA_CLASSES = ("Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "ChunkStorageMetadata",
                     "TensorProperties", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")
# Exact (module, name) pairs a checkpoint index may build; nothing else is ever looked up.
_ALLOWED = {("torch.distributed.checkpoint.metadata", n) for n in _METADATA_CLASSES} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"), ("collections", "OrderedDict"),
    ("builtins", "set"), ("builtins", "frozenset")}
_FUNCTIONS = {("torch.serialization", "_get_layout")}


def is_dcp_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding a ``torch.distributed.checkpoint`` (a ``.metadata`` file)."""
    p = Path(path)
    return p.is_dir() and (p / METADATA).is_file()


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only torch.distributed.checkpoint's metadata classes, torch dtypes and sizes."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.memory_format,
                                                                        torch.layout)):
            return getattr(torch, name)
        if "." not in name and (module, name) in _ALLOWED:
            obj = super().find_class(module, name)
            if (module, name) in _FUNCTIONS or (isinstance(obj, type) and obj.__module__ in (module, f"{module}._local")):
                return obj
        raise pickle.UnpicklingError(f"{module}.{name}")


def read_metadata(folder: str | os.PathLike) -> Any:
    """The checkpoint's ``Metadata`` (state-dict entries and where each piece is stored)."""
    p = Path(folder)
    if not is_dcp_folder(p):
        raise InspectorError(f"{p} is not a torch.distributed.checkpoint folder (it has no {METADATA} file)")
    try:
        with open(p / METADATA, "rb") as fh:
            metadata = _MetadataUnpickler(fh).load()
    except pickle.UnpicklingError as exc:
        raise InspectorError(f"{p.name}/{METADATA} was refused: it asks to run {exc} while loading, which a "
                             "checkpoint index never needs. Nothing in it was run.") from None
    except (EOFError, OSError, ValueError, AttributeError, ImportError) as exc:
        raise InspectorError(f"{p.name}/{METADATA} is corrupt or from an unknown torch version "
                             f"({type(exc).__name__}: {exc})") from None
    if not isinstance(getattr(metadata, "state_dict_metadata", None), dict) or not isinstance(
            getattr(metadata, "storage_data", None), dict):
        raise InspectorError(f"{p.name}/{METADATA} is not a checkpoint index (it holds a "
                             f"{type(metadata).__name__}); the file is corrupt")
    return metadata


@dataclass(frozen=True)
class Piece:
    """One stored piece of a tensor: where it sits in the tensor and in which file."""

    name: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    file_offset: int
    length: int


def _pieces(metadata: Any) -> dict[str, list[Piece]]:
    out: dict[str, list[Piece]] = {}
    for index, info in metadata.storage_data.items():
        if getattr(info, "transform_descriptors", None):
            raise InspectorError(f"tensor {index.fqn} is stored with transforms "
                                 f"{info.transform_descriptors}; this reader takes plain pieces only")
        entry = metadata.state_dict_metadata.get(index.fqn)
        chunks = getattr(entry, "chunks", None) or []
        sizes = next((tuple(c.sizes) for c in chunks if tuple(c.offsets) == tuple(index.offset or ())), ())
        try:
            piece = Piece(index.fqn, tuple(index.offset or ()), sizes, str(info.relative_path), int(info.offset),
                          int(info.length))
        except (TypeError, ValueError, AttributeError):
            raise InspectorError(f"{METADATA}: the storage entry of tensor {getattr(index, 'fqn', index)} is "
                                 "corrupt (its offset, length or file is not readable)") from None
        out.setdefault(index.fqn, []).append(piece)
    return out


def dcp_listing(folder: str | os.PathLike) -> pd.DataFrame:
    """One row per entry: ``name, kind, dtype, shape, numel, pieces, piece_shapes, files``.

    ``kind`` is ``"tensor"`` or ``"bytes"`` (a pickled non-tensor value, e.g. an optimizer step
    count, which is listed but never loaded).
    """
    metadata = read_metadata(folder)
    pieces = _pieces(metadata)
    rows = []
    for name, entry in metadata.state_dict_metadata.items():
        own = pieces.get(name, [])
        files = ", ".join(sorted({p.file for p in own}))
        if hasattr(entry, "size"):
            shape = tuple(entry.size)
            rows.append((name, "tensor", str(entry.properties.dtype).removeprefix("torch."), shape,
                         math.prod(shape), len(entry.chunks),
                         " ".join("x".join(map(str, c.sizes)) + "@" + ",".join(map(str, c.offsets))
                                  for c in entry.chunks), files))
        else:
            rows.append((name, "bytes", "", (), 0, len(own), "", files))
    return pd.DataFrame(rows, columns=["name", "kind", "dtype", "shape", "numel", "pieces", "piece_shapes", "files"])


def read_dcp(folder: str | os.PathLike) -> tuple[dict[str, torch.Tensor], list[Finding]]:
    """Whole tensors on the CPU from a distributed checkpoint folder, plus findings.

    Raises:
        InspectorError: the folder, its index or a piece is unreadable, or a piece is missing.
    """
    p = Path(folder)
    metadata = read_metadata(p)
    pieces = _pieces(metadata)
    state: dict[str, torch.Tensor] = {}
    skipped = []
    handles: dict[str, Any] = {}
    try:
        for name, entry in metadata.state_dict_metadata.items():
            if not hasattr(entry, "size"):
                skipped.append(name)
                continue
            state[name] = read_dcp_tensor(p, name, entry, pieces.get(name, []), handles)
    finally:
        for fh in handles.values():
            fh.close()
    findings = [Finding("distributed-checkpoint", "info", p.name,
                        f"{p.name} is a torch.distributed.checkpoint folder: {len(state)} tensors put together "
                        f"from {sum(len(pieces.get(k, [])) for k in state)} pieces in "
                        f"{len({x.file for k in state for x in pieces.get(k, [])})} files")]
    if skipped:
        findings.append(Finding("checkpoint-non-tensor", "info", skipped[0],
                                f"{len(skipped)} entries of {p.name} are not tensors (first: {skipped[0]}); "
                                "they were listed but not loaded (loading them would unpickle them)"))
    return state, findings


def read_dcp_tensor(folder: Path, name: str, entry: Any, own: list[Piece], handles: dict[str, Any]) -> torch.Tensor:
    """One whole tensor on the CPU from its pieces (``own``), after every bounds and shape check;
    ``handles`` keeps the open ``.distcp`` files (the caller closes them)."""
    shape = _checked_shape(folder, name, entry, own)
    if len(own) == 1 and not any(own[0].offsets):  # one piece: the whole tensor, once it is checked
        value = _read_piece(folder, own[0], handles)
        if tuple(value.shape) == shape and value.dtype == entry.properties.dtype and own[0].sizes in ((), shape):
            return value
    whole = torch.empty(shape, dtype=entry.properties.dtype)
    covered = torch.zeros(whole.shape, dtype=torch.bool)
    filled = 0
    for piece in own:
        value = _read_piece(folder, piece, handles)
        region, seen = _region(folder, piece, value, whole, covered)
        region.copy_(value)
        seen.fill_(True)
        filled += value.numel()
    if filled != whole.numel():
        raise InspectorError(f"{folder.name}: tensor {name} has pieces for {filled} of its {whole.numel()} "
                             "elements; a rank's .distcp file is missing or incomplete")
    return whole


def dcp_pieces(metadata: Any) -> dict[str, list[Piece]]:
    """The stored pieces of every tensor of a checkpoint index (:func:`read_metadata`), by name."""
    return _pieces(metadata)


def _checked_shape(folder: Path, name: str, entry: Any, own: list[Piece]) -> tuple[int, ...]:
    """The entry's shape, once its size, dtype and pieces are plausible for the bytes stored."""
    size = tuple(getattr(entry, "size", ()))
    dtype = getattr(getattr(entry, "properties", None), "dtype", None)
    if not isinstance(dtype, torch.dtype) or not all(isinstance(n, int) and n >= 0 for n in size):
        raise InspectorError(f"{folder.name}/{METADATA}: tensor {name} has an invalid size {size!r} or dtype "
                             f"{dtype!r}; the index is corrupt")
    stored = 0
    for piece in own:
        if len(piece.offsets) != len(size) or any(not isinstance(o, int) or o < 0 for o in piece.offsets):
            raise InspectorError(f"{folder.name}/{METADATA}: a piece of tensor {name} has offsets "
                                 f"{piece.offsets} for a tensor of shape {size}; the index is corrupt")
        if piece.file_offset < 0 or piece.length < 0:
            raise InspectorError(f"{folder.name}/{METADATA}: a piece of tensor {name} has a negative place "
                                 f"or length in {piece.file}; the index is corrupt")
        stored += piece.length
    needed = math.prod(size) * dtype.itemsize
    if needed > stored:
        raise InspectorError(f"{folder.name}/{METADATA}: tensor {name} claims shape {size} ({needed} bytes) but its "
                             f"pieces hold only {stored} bytes; the index is corrupt")
    return size


def _region(folder: Path, piece: Piece, value: torch.Tensor, whole: torch.Tensor,
            covered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where ``value`` goes in ``whole`` (and in the ``covered`` mask), after bounds, shape and dtype checks."""
    where = f"{folder.name}: the piece of {piece.name} at offset {piece.offsets} in {piece.file}"
    if value.dtype != whole.dtype:
        raise InspectorError(f"{where} is {value.dtype}, but the index says {whole.dtype}")
    if value.dim() != whole.dim() or (piece.sizes and tuple(value.shape) != piece.sizes):
        raise InspectorError(f"{where} has shape {tuple(value.shape)}, but the index says "
                             f"{piece.sizes or tuple(whole.shape)}")
    if any(o + n > total for o, n, total in zip(piece.offsets, value.shape, whole.shape)):
        raise InspectorError(f"{where} with shape {tuple(value.shape)} reaches past the tensor's shape "
                             f"{tuple(whole.shape)}")
    region, seen = whole, covered
    for dim, (start, size) in enumerate(zip(piece.offsets, value.shape)):
        region, seen = region.narrow(dim, start, size), seen.narrow(dim, start, size)
    if bool(seen.any()):
        raise InspectorError(f"{where} overlaps another piece of the same tensor; the index is corrupt")
    return region, seen


def _read_piece(folder: Path, piece: Piece, handles: dict[str, Any]) -> torch.Tensor:
    path = (folder / piece.file).resolve()
    if not path.is_relative_to(folder.resolve()):
        raise InspectorError(f"{folder.name}: tensor {piece.name} points outside the folder ({piece.file})")
    fh = handles.get(piece.file)
    if fh is None:
        try:
            fh = handles[piece.file] = open(path, "rb")
        except OSError as exc:
            raise InspectorError(f"{folder.name}: {piece.file} (holding {piece.name}) cannot be read: {exc}") from None
    if piece.file_offset + piece.length > os.fstat(fh.fileno()).st_size:
        raise InspectorError(f"{folder.name}: the piece of {piece.name} needs bytes {piece.file_offset}.."
                             f"{piece.file_offset + piece.length} of {piece.file}, which is shorter")
    fh.seek(piece.file_offset)
    data = fh.read(piece.length)
    try:
        value = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure is a corrupt piece
        raise InspectorError(f"{folder.name}: the piece of {piece.name} in {piece.file} is corrupt "
                             f"({type(exc).__name__})") from None
    if not isinstance(value, torch.Tensor):
        raise InspectorError(f"{folder.name}: the piece of {piece.name} in {piece.file} is not a tensor")
    return value
