"""Checkpoints -> state dicts: read safetensors, torch and distributed checkpoints without running
code from them, refuse Hugging Face folders that would run code, and copy a state dict into a model."""

from __future__ import annotations

import os
import pickle
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..utils.findings import Finding, InspectorError, first_line
from ..utils.paths import file_kind
from .checkpoint_guards import (
    check_zip_sizes,
    is_safetensors,
    printable_keys,
    readable_path,
    refuse_uncopyable,
    shown_name,
)
from .folders import FolderFiles, folder_files
from .hf_limits import refuse_code_fields
from .training_state import MODEL_PARTS


def refuse_remote_code(path: Path) -> None:
    """Refuse a Hugging Face folder whose config asks transformers to run Python from the folder.

    ``auto_map`` in ``config.json`` names classes in the folder's own ``.py`` files; loading
    them would run that code. The file is read as JSON only; nothing from it runs.
    """
    import json

    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InspectorError(f"{config_file} is not readable JSON ({type(exc).__name__}: {exc}); "
                             "fix or replace the folder's config.json") from None
    if not isinstance(config, dict):
        raise InspectorError(f"{config_file} does not hold a JSON object; fix or replace it")
    refuse_code_fields(config, path)


def read_checkpoint(
    path: str | os.PathLike, *, mmap: bool = False
) -> tuple[dict[str, torch.Tensor], list[Finding]]:
    """A state dict from a ``.safetensors`` or ``.pt/.pth/.bin`` file, or a ``torch.distributed.checkpoint``
    folder; never runs code from it. ``mmap``: a torch zip file's tensors stay on disk until read.

    A torch zip whose entries declare more bytes than the archive could hold is refused before
    anything is inflated; keys that are not valid Unicode text come back escaped, with a warning.
    """
    path = Path(path)
    found = folder_files(path) if path.is_dir() and not (path / ".metadata").is_file() else None
    if found is not None:
        return _read_folder(path, found, mmap)
    if path.is_dir():  # a torch.distributed.checkpoint folder, put together in this process
        from .dcp import read_dcp
        state, findings = read_dcp(path)
    elif not path.is_file():
        special = file_kind(path)
        if special:  # a FIFO would block the reader, a device never end: refused before opening
            raise InspectorError(f"checkpoint {shown_name(path, full=True)} is {special}, not a regular "
                                 "file; give a checkpoint file")
        raise InspectorError(f"checkpoint {shown_name(path, full=True)} does not exist")
    else:
        with readable_path(path) as readable:
            state, findings = _read_file(readable, shown_name(path), mmap)
    state, renamed = printable_keys(state, shown_name(path))
    return state, findings + renamed


def _read_folder(path: Path, found: FolderFiles, mmap: bool) -> tuple[dict[str, torch.Tensor], list[Finding]]:
    """Every tensor of a checkpoint folder's weight files (those its index names, when it has one)."""
    findings = [Finding("checkpoint-folder", "info", path.name, f"read {path.name} through {found.how}")]
    parts: dict[Path, dict[str, torch.Tensor]] = {}

    def read_each() -> Iterator[tuple[Path, dict[str, torch.Tensor]]]:
        for file in found.files:
            part, more = read_checkpoint(file, mmap=mmap)
            findings.extend(more)
            parts[file] = part
            yield file, part

    owner = found.assign(read_each(), path.name)
    return {name: parts[file][name] for name, file in owner.items()}, findings


def _read_file(path: Path, name: str, mmap: bool) -> tuple[dict[str, torch.Tensor], list[Finding]]:
    findings: list[Finding] = []
    if is_safetensors(path):
        from safetensors.torch import load_file

        try:
            return load_file(str(path)), findings
        except Exception as exc:
            raise InspectorError(f"checkpoint {name} is not a readable safetensors file "
                                 f"({type(exc).__name__}: {exc}); re-save it with safetensors") from exc
    is_zip = zipfile.is_zipfile(path)
    if is_zip:
        check_zip_sizes(path, name)
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and is_zip)
    except pickle.UnpicklingError as exc:
        detail = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\.\s|\n|$)", str(exc))
        detail_text = detail.group(1).strip() if detail else ""
        calls = pickle_globals(path)
        if calls or "global" in detail_text.lower():
            named = f" ({', '.join(calls[:3])})" if calls else f" ({detail_text})"
            raise InspectorError(
                f"checkpoint {name} was refused: it asks to run Python code while loading"
                f"{named}. Only plain tensors are accepted and nothing in it was run. "
                "If you trust it, re-save its state dict with safetensors."
            ) from None
        raise InspectorError(
            f"checkpoint {name} is corrupt or not a torch file ({detail_text or 'unreadable pickle'})"
        ) from None
    except Exception as exc:  # noqa: BLE001 - any other failure means the file is not a torch file
        calls = pickle_globals(path)
        if calls:
            raise InspectorError(
                f"checkpoint {name} was refused: it asks to run Python code while loading "
                f"({', '.join(calls[:3])}). Only plain tensors are accepted and nothing in it was run. "
                "If you trust it, re-save its state dict with safetensors."
            ) from None
        first = first_line(exc)
        raise InspectorError(
            f"checkpoint {name} is corrupt or not a torch file "
            f"({type(exc).__name__}{': ' + first[:200] if first else ''}); give a "
            ".safetensors file or one written by torch.save(model.state_dict(), path)"
        ) from None
    if isinstance(obj, dict):
        for key in MODEL_PARTS:
            inner = obj.get(key)
            if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                others = ", ".join(repr(k) for k in list(obj)[:5] if k != key)
                findings.append(Finding("checkpoint-nested", "info", name,
                                        f"used the state dict under key {key!r} of {name}" + (
                                            f" (its other keys: {others})" if others else "")))
                obj = inner
                break
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                            for k, v in obj.items()):
        raise InspectorError(f"checkpoint {name} is not a state dict (a dict of names to tensors); "
                             f"it holds {type(obj).__name__}")
    return obj, findings


def pickle_globals(path: Path) -> list[str]:
    """Callables outside torch's own that a checkpoint's pickle names; nothing in it is executed.

    A torch zip file is read by ``torch.serialization.get_unsafe_globals_in_checkpoint``
    (everything outside torch's ``weights_only`` allowlist). That function refuses bare and
    legacy pickles, and torch's error for them names no callable, so those are read with
    ``pickletools.genops``, which parses opcodes of every protocol and executes nothing.
    """
    try:
        if zipfile.is_zipfile(path):
            return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        data = path.read_bytes()
    except Exception:  # noqa: BLE001 - an unreadable file names nothing
        return []
    return _bare_pickle_globals(data)


_TORCH_GLOBALS = ("torch.", "collections.OrderedDict", "builtins.set", "_codecs.encode")


def _bare_pickle_globals(data: bytes) -> list[str]:
    """The globals named by the pickles at the start of ``data``, minus torch's own, in file order."""
    import io
    import pickletools

    found: list[str] = []
    strings: list[str] = []
    stream = io.BytesIO(data)
    # A legacy torch file is several pickles in a row (magic number, protocol, system info,
    # the object), then raw storage bytes: read pickle after pickle until one does not parse.
    while stream.tell() < len(data):
        try:
            for op, arg, _ in pickletools.genops(stream):
                if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
                    strings.append(str(arg))
                elif op.name == "GLOBAL":
                    found.append(str(arg).replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(f"{strings[-2]}.{strings[-1]}")
        except Exception:  # noqa: BLE001 - past the last pickle (or a broken one): stop reading
            break
    return [g for g in dict.fromkeys(found) if not g.startswith(_TORCH_GLOBALS)]


WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def strip_wrapper_prefix(
    state: dict[str, torch.Tensor], own: dict[str, Any]
) -> tuple[dict[str, torch.Tensor], str]:
    """``state`` without the ``_orig_mod.`` / ``module.`` prefixes a wrapped model writes, when
    every key has them and the model's names do not; returns the prefix stripped ("" for none).

    >>> strip_wrapper_prefix({"_orig_mod.module.w": 1}, {"w": 0})
    ({'w': 1}, '_orig_mod.module.')
    """
    stripped = ""
    while state and not any(k in own for k in state):
        prefix = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in state)), None)
        if prefix is None:
            break
        state = {k[len(prefix):]: v for k, v in state.items()}
        stripped += prefix
    return state, stripped


def model_part(
    state: dict[str, torch.Tensor], own: dict[str, Any], name: str
) -> tuple[dict[str, torch.Tensor], list[Finding]]:
    """The part of ``state`` under one top-level name (``model`` of ``{"model": ..., "optim": ...,
    "step": ...}``, as ``torch.distributed.checkpoint`` tutorials save it), when no key fits the
    model as it is and that part's keys do; an info finding names the parts skipped.

    >>> part, found = model_part({"model.w": 1, "optim.state.w.exp_avg": 2}, {"w": 0}, "ckpt")
    >>> part, found[0].message
    ({'w': 1}, "used the 'model' part of ckpt; skipped the other top-level parts: optim (1 entries)")
    """
    if not state or any(k in own for k in state):
        return state, []
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        top, dot, rest = key.partition(".")
        if dot:
            parts.setdefault(top, {})[rest] = value
    fits = {top: sum(k in own for k in part) for top, part in parts.items()}
    best = max(fits, key=lambda top: fits[top], default=None)
    if best is None or not fits[best]:
        return state, []
    skipped = {key.partition(".")[0] for key in state if key.partition(".")[0] != best}
    counts = ", ".join(
        f"{top} ({sum(k.partition('.')[0] == top for k in state)} entries)" for top in sorted(skipped)
    )
    return parts[best], [Finding("checkpoint-part", "info", name,
                                 f"used the {best!r} part of {name}; skipped the other top-level parts: "
                                 f"{counts or 'none'}")]


def refuse_filling_nothing(state: dict[str, torch.Tensor], own: dict[str, Any], name: str) -> None:
    """Raise when no tensor of ``state`` has a place in the model: loading it would leave every
    tensor at its initial value, which is never what was meant."""
    if any(k in own for k in state):
        return
    theirs = ", ".join(list(state)[:3]) or "none: it holds no tensors"
    mine = ", ".join(list(own)[:3]) or "none"
    raise InspectorError(f"checkpoint {name} fills none of the model's {len(own)} tensors: its names "
                         f"(first: {theirs}) match none of the model's (first: {mine}); nothing was loaded. "
                         "Give the checkpoint saved from this model")


def apply_checkpoint(model: nn.Module, path: str | os.PathLike) -> list[Finding]:
    """Copy a checkpoint into ``model`` in place, keeping its ties; findings say what happened.

    Missing and unexpected keys become warnings. A key missing only because its tie partner
    is present (a tied model saved by safetensors keeps one name) is filled through the tie.
    A shape mismatch raises before anything is copied, so the model is unchanged.
    """
    state, findings = read_checkpoint(path)
    name = shown_name(Path(path))
    own = model.state_dict(keep_vars=True)
    state, stripped = strip_wrapper_prefix(state, own)
    if stripped:
        findings.append(Finding("checkpoint-wrapped", "info", name,
                                f"{name} was saved from a wrapped model (names start with {stripped!r}, "
                                "as torch.compile or DDP write them); the names were read without it"))
    state, part_findings = model_part(state, own, name)
    findings += part_findings
    refuse_filling_nothing(state, own, name)
    refuse_uncopyable(state, own, name)
    by_id: dict[int, list[str]] = {}
    for key, t in own.items():
        by_id.setdefault(id(t), []).append(key)
    for key, t in state.items():
        if key in own and tuple(own[key].shape) != tuple(t.shape):
            raise InspectorError(f"checkpoint {name}: tensor {key} has shape {tuple(t.shape)} but the "
                                 f"model expects {tuple(own[key].shape)}; nothing was loaded")
    missing: list[tuple[str, list[str]]] = []
    restored: list[tuple[str, list[str]]] = []
    for key, t in own.items():
        if key in state:
            continue
        partners = [k for k in by_id[id(t)] if k in state]
        (restored if partners else missing).append((key, partners))
    unexpected = [k for k in state if k not in own]
    for key, partners in restored:
        findings.append(Finding("tie-restored", "info", key,
                                f"{key} is not in {name}; it is tied to {partners[0]}, which is, so it "
                                "shares that value"))
    for key, _ in missing:
        findings.append(Finding("missing-key", "warning", key,
                                f"{key} is not in {name}; it keeps its initial value"))
    for key in unexpected:
        findings.append(Finding("unexpected-key", "warning", key,
                                f"{key} is in {name} but the model has no such tensor; it was ignored"))
    findings += _dtype_findings(own, state, name)
    for keys in by_id.values():
        present = [k for k in keys if k in state]
        if len(present) > 1 and any(not torch.equal(state[present[0]], state[k]) for k in present[1:]):
            findings.append(Finding("tie-conflict", "warning", present[0],
                                    f"{name} holds different values for the tied names "
                                    f"{', '.join(present)}; the model keeps one tensor, with the "
                                    f"value of {present[-1]}"))
    with torch.no_grad():
        model.load_state_dict(state, strict=False)
    return findings


def _kind(dtype: torch.dtype) -> str:
    return ("bool" if dtype == torch.bool else "complex" if dtype.is_complex else
            "floating-point" if dtype.is_floating_point else "integer")


def _dtype_findings(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor], name: str) -> list[Finding]:
    """A warning for each checkpoint tensor whose kind (integer, floating...) differs from the
    model's tensor it is copied into, an info for each other dtype change; the copy casts."""
    out = []
    for key, t in state.items():
        mine = own.get(key)
        if mine is None or mine.dtype == t.dtype:
            continue
        have, got = str(mine.dtype).removeprefix("torch."), str(t.dtype).removeprefix("torch.")
        if _kind(mine.dtype) != _kind(t.dtype):
            out.append(Finding("dtype-mismatch", "warning", key,
                               f"{name} holds {key} as {got} ({_kind(t.dtype)}) but the model's tensor is "
                               f"{have}; the values were cast to {have}. Check that the checkpoint "
                               "belongs to this model, or re-save it with the right dtype"))
        else:
            out.append(Finding("dtype-cast", "info", key,
                               f"{name} holds {key} as {got}; it was cast to the model's {have}"))
    return out
