"""Checks on an untrusted checkpoint made before anything is inflated, allocated or copied.

An input may cost at most a small multiple of its own size: a torch zip file whose entries
declare more bytes than the archive could hold is refused before torch inflates them. A file
whose name is not UTF-8 is opened through its descriptor; keys that cannot be written as UTF-8
are shown escaped; tensors that cannot be copied into a model (sparse, meta, quantized) are named
before any other key is copied.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import torch

from ..utils.findings import Finding, InspectorError
from ..utils.paths import file_kind

#: A torch zip stores its entries uncompressed; all entries together may declare at most this
#: many times the archive's own size (plus :data:`ZIP_SLACK` bytes) before they are refused.
ZIP_RATIO = 2
ZIP_SLACK = 1 << 20


def check_zip_sizes(source: str | os.PathLike | IO[bytes], name: str) -> None:
    """Refuse a zip archive whose entries would inflate to more than :data:`ZIP_RATIO` times its size.

    Only the central directory is read; no entry is inflated.

    Raises:
        InspectorError: naming the file, the entry that declares the most bytes and the limit.
    """
    try:
        with zipfile.ZipFile(source) as archive:
            entries = archive.infolist()
            size = archive.fp.seek(0, io.SEEK_END) if archive.fp is not None else 0
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return  # not a zip (or a broken one): torch's reader says so itself
    declared = sum(e.file_size for e in entries)
    limit = ZIP_RATIO * size + ZIP_SLACK
    if declared > limit:
        biggest = max(entries, key=lambda e: e.file_size)
        raise InspectorError(
            f"checkpoint {name} was refused: its entries declare {declared:,} bytes "
            f"({biggest.filename} alone {biggest.file_size:,}) in a {size:,}-byte archive, more than "
            f"{ZIP_RATIO}x its size; torch writes its files uncompressed, so this one would inflate "
            "far beyond what it holds. Nothing was inflated. Re-save it with torch.save or safetensors.")


@contextmanager
def readable_path(path: Path) -> Iterator[Path]:
    """``path``, or (when its name is not UTF-8, which safetensors and torch's mmap cannot open)
    the same file through ``/proc/self/fd``."""
    try:
        os.fsencode(path).decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        yield path
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        alias = Path(f"/proc/self/fd/{fd}")
        yield alias if alias.exists() else path
    finally:
        os.close(fd)


def shown_name(path: Path, full: bool = False) -> str:
    """The file's name (or whole path) as printable text (bytes that are not UTF-8 as ``\\xff``)."""
    return os.fsencode(path if full else path.name).decode("utf-8", "backslashreplace")


def file_head(path: str | os.PathLike, size: int) -> bytes:
    """The first ``size`` bytes of ``path`` (fewer when it is shorter; ``b""`` when it cannot be read):
    what tells the kinds of file apart, whatever their names."""
    if file_kind(path):  # a FIFO, a device, a folder: nothing to tell apart, and opening could block
        return b""
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except OSError:
        return b""


def is_safetensors(path: Path) -> bool:
    """Whether ``path`` is a safetensors file: by its suffix in any case, or by its header
    (8 bytes of little-endian length, then a JSON object)."""
    if path.suffix.lower() == ".safetensors":
        return True
    head = file_head(path, 10)
    return len(head) == 10 and head[8:9] == b"{" and 0 < int.from_bytes(head[:8], "little") < (100 << 20)


def printable_keys(
    state: dict[str, torch.Tensor], name: str
) -> tuple[dict[str, torch.Tensor], list[Finding]]:
    """``state`` with every key that cannot be written as UTF-8 (a lone surrogate) escaped as text,
    plus a warning for each; such a key can match no model tensor in any case."""
    out: dict[str, torch.Tensor] = {}
    findings = []
    for key, value in state.items():
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            shown = key.encode("utf-8", "backslashreplace").decode("utf-8")
            findings.append(
                Finding(
                    "checkpoint-key-not-text",
                    "warning",
                    shown,
                    f"{name} holds a key that is not valid Unicode text ({shown}); it is shown "
                    "with the bad characters escaped and matches no model tensor",
                )
            )
            key = shown
        out[key] = value
    return out, findings


def refuse_uncopyable(state: dict[str, torch.Tensor], own: dict[str, torch.Tensor], name: str) -> None:
    """Raise before anything is copied when a tensor meant for the model is sparse, quantized,
    nested or on the meta device (``load_state_dict`` would fail half way through)."""
    for key, t in state.items():
        if key not in own:
            continue
        why = ("on the meta device (a shape without values)" if t.device.type == "meta" else
               f"in the {str(t.layout).removeprefix('torch.')} layout" if t.layout != torch.strided else
               "quantized" if t.is_quantized else "a nested tensor" if t.is_nested else "")
        if why:
            raise InspectorError(f"checkpoint {name}: tensor {key} is {why}, so it cannot be copied into "
                                 "the model; nothing was loaded. Save dense values (tensor.to_dense(), "
                                 "or the real weights) instead.")
