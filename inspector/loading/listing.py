"""What a checkpoint holds (names, dtypes, shapes) without reading its tensor values."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from ..utils.findings import Finding, InspectorError
from .checkpoint_guards import is_safetensors, printable_keys, readable_path, shown_name
from .checkpoints import read_checkpoint
from .dcp import dcp_listing, is_dcp_folder
from .folders import FolderFiles, folder_files

COLUMNS = ["name", "kind", "dtype", "shape", "numel"]
# safetensors' dtype codes -> torch's names
_SAFETENSORS_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
                       "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
                       "F8_E8M0": "float8_e8m0fnu", "I64": "int64", "I32": "int32",
                       "I16": "int16", "I8": "int8", "U64": "uint64", "U32": "uint32", "U16": "uint16",
                       "U8": "uint8", "BOOL": "bool", "C64": "complex64"}


def checkpoint_listing(path: str | os.PathLike) -> tuple[pd.DataFrame, list[Finding]]:
    """One row per entry (``name, kind, dtype, shape, numel``; a distributed checkpoint folder
    adds ``pieces, piece_shapes, files``), plus findings. ``path`` is a checkpoint file, a
    distributed checkpoint folder, or a folder of weight files (a sharded or plain Hugging Face
    folder: read through its index when it has one).

    A ``.safetensors`` file is read through its header only; a torch zip file is memory-mapped,
    so its tensor bytes are never read; a distributed checkpoint's pieces are never opened.

    Raises:
        InspectorError: the file is missing, corrupt or asks to run code.
    """
    p = Path(path)
    if is_dcp_folder(p):
        return dcp_listing(p), []
    found = folder_files(p)
    if found is not None:
        return _folder_listing(p, found)
    if p.is_dir():
        raise InspectorError(f"{p} holds no checkpoint: no .metadata (torch.distributed.checkpoint), "
                             "no .safetensors file, pytorch_model.bin or index")
    if p.is_file() and is_safetensors(p):
        with readable_path(p) as readable:
            table = _safetensors_listing(readable, shown_name(p))
        keys, findings = printable_keys(dict.fromkeys(table["name"]), shown_name(p))  # type: ignore[arg-type]
        return table.assign(name=list(keys)), findings
    state, findings = read_checkpoint(p, mmap=True)
    rows = [(k, "tensor", str(v.dtype).removeprefix("torch."), tuple(v.shape), math.prod(v.shape))
            for k, v in state.items()]
    return pd.DataFrame(rows, columns=COLUMNS), findings


def _folder_listing(p: Path, found: FolderFiles) -> tuple[pd.DataFrame, list[Finding]]:
    """The listings of a folder's weight files, one table (the tensors its index names, when it has one)."""
    tables = []
    findings = [Finding("checkpoint-folder", "info", p.name, f"read {p.name} through {found.how}")]
    for file in found.files:
        table, more = checkpoint_listing(file)
        if found.owner:
            table = table[table["name"].map(lambda n, f=file: found.owner.get(n) == f)]
        tables.append(table)
        findings += more
    table = pd.concat(tables, ignore_index=True) if tables else pd.DataFrame(columns=COLUMNS)
    twice = table["name"][table["name"].duplicated()].tolist()
    if twice:
        raise InspectorError(f"{p.name}: tensor {twice[0]} is in two of its files; a checkpoint folder holds "
                             "each tensor once (or names the file of each in its index)")
    lost = sorted(set(found.owner) - set(table["name"]))
    if lost:
        raise InspectorError(f"{p.name}: the index stores {len(lost)} tensors in files that do not hold "
                             f"them (first: {lost[0]}); the folder's shards and index do not match")
    return table, findings


def _safetensors_listing(path: Path, name: str) -> pd.DataFrame:
    from safetensors import safe_open

    rows = []
    try:
        with safe_open(str(path), framework="pt") as fh:
            for key in fh.keys():
                piece = fh.get_slice(key)
                shape, code = tuple(piece.get_shape()), piece.get_dtype()
                rows.append(
                    (key, "tensor", _SAFETENSORS_DTYPES.get(code, code.lower()), shape, math.prod(shape))
                )
    except Exception as exc:  # noqa: BLE001 - any failure means the header is not safetensors
        raise InspectorError(
            f"checkpoint {name} is not a readable safetensors file "
            f"({type(exc).__name__}: {exc}); re-save it with safetensors"
        ) from None
    return pd.DataFrame(rows, columns=COLUMNS)
