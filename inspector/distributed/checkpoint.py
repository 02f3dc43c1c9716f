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
_ALLOWED_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem",
                    "torch.distributed.checkpoint._extension")
_ALLOWED = {("torch", "Size"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"),
            ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"), ("pathlib", "PureWindowsPath"),
            ("collections", "OrderedDict"), ("builtins", "set"), ("builtins", "frozenset")}


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
        if (module, name) in _ALLOWED or (module in _ALLOWED_MODULES and not name.startswith("__")):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name}")


def read_metadata(folder: str | os.PathLike) -> Any:
    """The checkpoint's ``Metadata`` (state-dict entries and where each piece is stored)."""
    p = Path(folder)
    if not is_dcp_folder(p):
        raise InspectorError(f"{p} is not a torch.distributed.checkpoint folder (it has no {METADATA} file)")
    try:
        with open(p / METADATA, "rb") as fh:
            return _MetadataUnpickler(fh).load()
    except pickle.UnpicklingError as exc:
        raise InspectorError(f"{p.name}/{METADATA} was refused: it asks to run {exc} while loading, which a "
                             "checkpoint index never needs. Nothing in it was run.") from None
    except (EOFError, OSError, ValueError, AttributeError, ImportError) as exc:
        raise InspectorError(f"{p.name}/{METADATA} is corrupt or from an unknown torch version "
                             f"({type(exc).__name__}: {exc})") from None


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
        out.setdefault(index.fqn, []).append(Piece(index.fqn, tuple(index.offset or ()), sizes,
                                                   str(info.relative_path), int(info.offset), int(info.length)))
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
            whole = torch.empty(tuple(entry.size), dtype=entry.properties.dtype)
            filled = 0
            for piece in pieces.get(name, []):
                value = _read_piece(p, piece, handles)
                region = whole
                for dim, (start, size) in enumerate(zip(piece.offsets, value.shape)):
                    region = region.narrow(dim, start, size)
                region.copy_(value)
                filled += value.numel()
            if filled != whole.numel():
                raise InspectorError(f"{p.name}: tensor {name} has pieces for {filled} of its {whole.numel()} "
                                     "elements; a rank's .distcp file is missing or incomplete")
            state[name] = whole
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
