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
#: safetensors' dtype codes -> torch's dtype names (``getattr(torch, name)``, which fails for a dtype
#: this torch lacks). :data:`.hf_saved.SAFETENSORS_DTYPES` holds this torch's dtypes themselves.
SAFETENSORS_DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
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
    findings = [Finding("checkpoint-folder", "info", p.name, f"read {p.name} through {found.how}")]
    tables: dict[Path, pd.DataFrame] = {}
    for file in found.files:
        tables[file], more = checkpoint_listing(file)
        findings += more
    owner = found.assign(((file, table["name"]) for file, table in tables.items()), p.name)
    kept = [table[table["name"].map(lambda n, f=file: owner.get(n) == f)] for file, table in tables.items()]
    table = pd.concat(kept, ignore_index=True) if kept else pd.DataFrame(columns=COLUMNS)
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
                    (key, "tensor", SAFETENSORS_DTYPE_NAMES.get(code, code.lower()), shape, math.prod(shape))
                )
    except Exception as exc:  # noqa: BLE001 - any failure means the header is not safetensors
        raise InspectorError(
            f"checkpoint {name} is not a readable safetensors file "
            f"({type(exc).__name__}: {exc}); re-save it with safetensors"
        ) from None
    return pd.DataFrame(rows, columns=COLUMNS)
