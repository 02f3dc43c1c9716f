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

from ..utils.findings import Finding, InspectorError
from ..utils.paths import regular_file
from .checkpoint_guards import check_zip_sizes

METADATA = ".metadata"
_METADATA_CLASSES = (
    "Metadata",
    "MetadataIndex",
    "StorageMeta",
    "TensorStorageMetadata",
    "ChunkStorageMetadata",
    "TensorProperties",
    "BytesStorageMetadata",
    "_MEM_FORMAT_ENCODING",
)
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
            if (module, name) in _FUNCTIONS or (
                isinstance(obj, type) and obj.__module__ in (module, f"{module}._local")
            ):
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


@dataclass(frozen=True)
class Entry:
    """One state-dict entry of the index: a tensor (shape, dtype, chunks) or pickled bytes."""

    name: str
    kind: str  # "tensor" or "bytes"
    shape: tuple[int, ...] = ()
    dtype: torch.dtype | None = None
    chunks: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()  # (offsets, sizes)


def _ints(value: Any) -> tuple[int, ...] | None:
    try:
        out = tuple(value)
    except TypeError:
        return None
    return out if all(type(n) is int and n >= 0 for n in out) else None


def _entries(folder: Path, metadata: Any) -> dict[str, Entry]:
    """Every entry of the index, its fields checked for type (an index is data from a file)."""
    out: dict[str, Entry] = {}
    for name, entry in metadata.state_dict_metadata.items():
        if not isinstance(name, str):
            raise InspectorError(
                f"{folder.name}/{METADATA}: an entry is named {name!r}, not by text; the index is corrupt"
            )
        if not hasattr(entry, "size"):
            out[name] = Entry(name, "bytes")
            continue
        shape, dtype = _ints(entry.size), getattr(getattr(entry, "properties", None), "dtype", None)
        chunks = getattr(entry, "chunks", None)
        parsed = [(_ints(getattr(c, "offsets", None)), _ints(getattr(c, "sizes", None)))
                  for c in chunks] if isinstance(chunks, list) else None
        if shape is None or not isinstance(dtype, torch.dtype) or parsed is None or any(
                o is None or z is None for o, z in parsed):
            raise InspectorError(f"{folder.name}/{METADATA}: tensor {name} has no readable size, dtype "
                                 "(properties) or list of pieces (chunks); the index is corrupt")
        out[name] = Entry(
            name, "tensor", shape, dtype, tuple((o, z) for o, z in parsed if o is not None and z is not None)
        )
    return out


def _pieces(folder: Path, metadata: Any, entries: dict[str, Entry]) -> dict[str, list[Piece]]:
    out: dict[str, list[Piece]] = {}
    for index, info in metadata.storage_data.items():
        fqn = getattr(index, "fqn", None)
        if not isinstance(fqn, str):
            raise InspectorError(
                f"{folder.name}/{METADATA}: a storage entry is keyed by {index!r:.80}, not by a "
                "tensor name; the index is corrupt"
            )
        if getattr(info, "transform_descriptors", None):
            raise InspectorError(f"tensor {fqn} is stored with transforms "
                                 f"{info.transform_descriptors}; this reader takes plain pieces only")
        entry = entries.get(fqn)
        offsets = _ints(getattr(index, "offset", None) or ())
        sizes = next((z for o, z in (entry.chunks if entry else ()) if o == offsets), ())
        file_offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if offsets is None or type(file_offset) is not int or type(length) is not int or \
                not isinstance(getattr(info, "relative_path", None), (str, os.PathLike)):
            raise InspectorError(
                f"{folder.name}/{METADATA}: the storage entry of tensor {fqn} is corrupt (its "
                "offset, length or file is not readable)"
            )
        out.setdefault(fqn, []).append(
            Piece(fqn, offsets, sizes, str(info.relative_path), file_offset, length)
        )
    return out


def dcp_listing(folder: str | os.PathLike) -> pd.DataFrame:
    """One row per entry: ``name, kind, dtype, shape, numel, pieces, piece_shapes, files``.

    ``kind`` is ``"tensor"`` or ``"bytes"`` (a pickled non-tensor value, e.g. an optimizer step
    count, which is listed but never loaded).
    """
    p = Path(folder)
    metadata = read_metadata(p)
    entries = _entries(p, metadata)
    pieces = _pieces(p, metadata, entries)
    rows = []
    for name, entry in entries.items():
        own = pieces.get(name, [])
        files = ", ".join(sorted({x.file for x in own}))
        if entry.kind == "tensor":
            rows.append(
                (
                    name,
                    "tensor",
                    str(entry.dtype).removeprefix("torch."),
                    entry.shape,
                    math.prod(entry.shape),
                    len(entry.chunks),
                    " ".join("x".join(map(str, z)) + "@" + ",".join(map(str, o)) for o, z in entry.chunks),
                    files,
                )
            )
        else:
            rows.append((name, "bytes", "", (), 0, len(own), "", files))
    return pd.DataFrame(
        rows, columns=["name", "kind", "dtype", "shape", "numel", "pieces", "piece_shapes", "files"]
    )


def read_dcp(folder: str | os.PathLike) -> tuple[dict[str, torch.Tensor], list[Finding]]:
    """Whole tensors on the CPU from a distributed checkpoint folder, plus findings.

    Every size the index claims is checked against the files on disk before anything is
    allocated: all tensors together may not need more bytes than the files hold.

    Raises:
        InspectorError: the folder, its index or a piece is unreadable, or a piece is missing.
    """
    p = Path(folder)
    metadata = read_metadata(p)
    entries = _entries(p, metadata)
    pieces = _pieces(p, metadata, entries)
    tensors = [e for e in entries.values() if e.kind == "tensor"]
    _check_claims(p, tensors, pieces)
    state: dict[str, torch.Tensor] = {}
    handles: dict[str, Any] = {}
    try:
        for entry in tensors:
            state[entry.name] = _assemble(p, entry, pieces.get(entry.name, []), handles)
    finally:
        for fh in handles.values():
            fh.close()
    findings = [
        Finding(
            "distributed-checkpoint",
            "info",
            p.name,
            f"{p.name} is a torch.distributed.checkpoint folder: {len(state)} tensors put together "
            f"from {sum(len(pieces.get(k, [])) for k in state)} pieces in "
            f"{len({x.file for k in state for x in pieces.get(k, [])})} files",
        )
    ]
    skipped = [e.name for e in entries.values() if e.kind == "bytes"]
    if skipped:
        tops = ", ".join(dict.fromkeys(n.partition(".")[0] for n in skipped))
        findings.append(
            Finding(
                "checkpoint-non-tensor",
                "info",
                skipped[0],
                f"{len(skipped)} entries of {p.name} are not tensors (first: {skipped[0]}); they were "
                f"listed but not loaded (loading them would unpickle them). Their top-level "
                f"names: {tops}",
            )
        )
    return state, findings


def dcp_index(folder: str | os.PathLike) -> tuple[dict[str, Entry], dict[str, list[Piece]]]:
    """Every entry of a checkpoint folder's index and the stored pieces of each tensor, by name, once
    every claim was checked against the files (nothing allocated); read one with :func:`read_dcp_tensor`."""
    p = Path(folder)
    metadata = read_metadata(p)
    entries = _entries(p, metadata)
    pieces = _pieces(p, metadata, entries)
    _check_claims(p, [e for e in entries.values() if e.kind == "tensor"], pieces)
    return entries, pieces


def read_dcp_tensor(folder: Path, entry: Entry, own: list[Piece], handles: dict[str, Any]) -> torch.Tensor:
    """One whole tensor on the CPU from its checked pieces (``own``); ``handles`` keeps the open
    ``.distcp`` files (the caller closes them)."""
    return _assemble(folder, entry, own, handles)


def _assemble(folder: Path, entry: Entry, own: list[Piece], handles: dict[str, Any]) -> torch.Tensor:
    if len(own) == 1 and not any(own[0].offsets):  # one piece: the whole tensor, once it is checked
        value = _read_piece(folder, own[0], handles)
        if (
            tuple(value.shape) == entry.shape
            and value.dtype == entry.dtype
            and own[0].sizes in ((), entry.shape)
        ):
            return value
    whole = torch.empty(entry.shape, dtype=entry.dtype)
    covered = torch.zeros(whole.shape, dtype=torch.bool)
    filled = 0
    for piece in own:
        value = _read_piece(folder, piece, handles)
        region, seen = _region(folder, piece, value, whole, covered)
        region.copy_(value)
        seen.fill_(True)
        filled += value.numel()
    if filled != whole.numel():
        raise InspectorError(
            f"{folder.name}: tensor {entry.name} has pieces for {filled} of its {whole.numel()} "
            "elements; a rank's .distcp file is missing or incomplete"
        )
    return whole


def _check_claims(folder: Path, tensors: list[Entry], pieces: dict[str, list[Piece]]) -> None:
    """Raise unless every piece lies inside a file of the folder and every tensor (and all of them
    together) fits in the bytes stored, before any tensor is allocated."""
    sizes: dict[str, int] = {}
    for entry in tensors:
        _checked_shape(folder, entry, pieces.get(entry.name, []), sizes)
    needed = sum(math.prod(e.shape) * (e.dtype.itemsize if e.dtype else 1) for e in tensors)
    stored = sum(sizes.values())
    if needed > stored:
        raise InspectorError(
            f"{folder.name}/{METADATA}: its tensors claim {needed:,} bytes in all but its files "
            f"hold only {stored:,}; the index is corrupt (nothing was allocated)"
        )


def _file_size(folder: Path, piece: Piece, sizes: dict[str, int]) -> int:
    if piece.file not in sizes:
        path = (folder / piece.file).resolve()
        if not path.is_relative_to(folder.resolve()):
            raise InspectorError(
                f"{folder.name}: tensor {piece.name} points outside the folder ({piece.file})"
            )
        try:
            sizes[piece.file] = regular_file(path, f"{folder.name} piece").stat().st_size  # no FIFO
        except (OSError, InspectorError) as exc:
            raise InspectorError(
                f"{folder.name}: {piece.file} (holding {piece.name}) cannot be read: {exc}"
            ) from None
    return sizes[piece.file]


def _checked_shape(folder: Path, entry: Entry, own: list[Piece], sizes: dict[str, int]) -> None:
    """Raise unless the entry's pieces are plausible for its shape and lie inside their files."""
    name, size = entry.name, entry.shape
    stored = 0
    for piece in own:
        if len(piece.offsets) != len(size):
            raise InspectorError(f"{folder.name}/{METADATA}: a piece of tensor {name} has offsets "
                                 f"{piece.offsets} for a tensor of shape {size}; the index is corrupt")
        if piece.file_offset < 0 or piece.length < 0:
            raise InspectorError(f"{folder.name}/{METADATA}: a piece of tensor {name} has a negative place "
                                 f"or length in {piece.file}; the index is corrupt")
        if piece.file_offset + piece.length > _file_size(folder, piece, sizes):
            raise InspectorError(f"{folder.name}: the piece of {piece.name} needs bytes {piece.file_offset}.."
                                 f"{piece.file_offset + piece.length} of {piece.file}, which is shorter")
        stored += piece.length
    needed = math.prod(size) * (entry.dtype.itemsize if entry.dtype else 1)
    if needed > stored:
        raise InspectorError(
            f"{folder.name}/{METADATA}: tensor {name} claims shape {size} ({needed} bytes) but its "
            f"pieces hold only {stored} bytes; the index is corrupt"
        )


def _region(folder: Path, piece: Piece, value: torch.Tensor, whole: torch.Tensor,
            covered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Where ``value`` goes in ``whole`` (and in the ``covered`` mask), after bounds, shape and dtype
    checks."""
    where = f"{folder.name}: the piece of {piece.name} at offset {piece.offsets} in {piece.file}"
    if value.dtype != whole.dtype:
        raise InspectorError(f"{where} is {value.dtype}, but the index says {whole.dtype}")
    if value.dim() != whole.dim() or (piece.sizes and tuple(value.shape) != piece.sizes):
        raise InspectorError(f"{where} has shape {tuple(value.shape)}, but the index says "
                             f"{piece.sizes or tuple(whole.shape)}")
    if any(o + n > total for o, n, total in zip(piece.offsets, value.shape, whole.shape, strict=True)):
        raise InspectorError(f"{where} with shape {tuple(value.shape)} reaches past the tensor's shape "
                             f"{tuple(whole.shape)}")
    region, seen = whole, covered
    for dim, (start, size) in enumerate(zip(piece.offsets, value.shape, strict=True)):
        region, seen = region.narrow(dim, start, size), seen.narrow(dim, start, size)
    if bool(seen.any()):
        raise InspectorError(f"{where} overlaps another piece of the same tensor; the index is corrupt")
    return region, seen


def _read_piece(folder: Path, piece: Piece, handles: dict[str, Any]) -> torch.Tensor:
    path = (folder / piece.file).resolve()
    fh = handles.get(piece.file)
    if fh is None:
        try:
            fh = handles[piece.file] = open(path, "rb")
        except OSError as exc:
            raise InspectorError(
                f"{folder.name}: {piece.file} (holding {piece.name}) cannot be read: {exc}"
            ) from None
    if piece.file_offset + piece.length > os.fstat(fh.fileno()).st_size:
        raise InspectorError(f"{folder.name}: the piece of {piece.name} needs bytes {piece.file_offset}.."
                             f"{piece.file_offset + piece.length} of {piece.file}, which is shorter")
    fh.seek(piece.file_offset)
    data = io.BytesIO(fh.read(piece.length))
    check_zip_sizes(data, f"{piece.file} (the piece of {piece.name})")
    data.seek(0)
    try:
        value = torch.load(data, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure is a corrupt piece
        raise InspectorError(f"{folder.name}: the piece of {piece.name} in {piece.file} is corrupt "
                             f"({type(exc).__name__})") from None
    if not isinstance(value, torch.Tensor):
        raise InspectorError(f"{folder.name}: the piece of {piece.name} in {piece.file} is not a tensor")
    return value
