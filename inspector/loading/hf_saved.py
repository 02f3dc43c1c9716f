"""The tensors saved in a Hugging Face folder, compared with a model, reading as little as it can.

Names, shapes and dtypes come from the files' headers (the safetensors header; a torch file is
opened memory-mapped, so its tensors are not read). Values are read only where a saved value may
differ from the model's tensor: when several saved tensors fill one model tensor (a tie), and when
transformers' loading report (``output_loading_info=True`` of ``from_pretrained``) says it did not
load a tensor the files hold. Without a loading report (a model changed since it was loaded) every
saved value is compared.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..utils.findings import Finding, InspectorError, Severity

#: Findings reported one by one; beyond this many of one kind they are summed up in one.
MAX_LISTED = 20
WEIGHT_FILES = (("model.safetensors.index.json", "model.safetensors"),
                ("pytorch_model.bin.index.json", "pytorch_model.bin"))
#: safetensors dtype names as torch dtypes (those this torch has).
SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    k: getattr(torch, v) for k, v in {
        "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
        "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32",
        "U64": "uint64", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
        "C64": "complex64"}.items() if hasattr(torch, v)}


@dataclass(frozen=True)
class SavedCheck:
    """How the tensors saved in a folder compare with a model.

    ``unexpected`` holds saved names the model has no place for; ``left`` model names no saved
    tensor filled (they hold their initial values); ``shape`` and ``dtype`` hold
    ``(model name, saved, model's)``; ``differ`` model names whose value is not the saved one.
    ``checked`` is False when the folder holds no weight file; ``values_read`` counts the saved
    tensors whose values were read.
    """

    folder: str
    checked: bool = True
    unexpected: tuple[str, ...] = ()
    left: tuple[str, ...] = ()
    shape: tuple[tuple[str, tuple[int, ...], tuple[int, ...]], ...] = ()
    dtype: tuple[tuple[str, torch.dtype, torch.dtype], ...] = ()
    differ: tuple[str, ...] = ()
    values_read: int = field(default=0, compare=False)
    #: the other names of each ``left`` tensor (a tie): reported once, under its first name
    also: Mapping[str, tuple[str, ...]] = field(default_factory=dict, compare=False)

    @property
    def is_saved_model(self) -> bool:
        """False when saved tensors were dropped *and* model tensors left at their initial values,
        or when a shape changed: the model is then not the one saved."""
        return not (self.unexpected and self.left) and not self.shape

    def findings(self) -> list[Finding]:
        """One finding per tensor (up to :data:`MAX_LISTED` of each kind, then one that counts the rest)."""
        name = self.folder
        if not self.checked:
            return [Finding("hf-not-checked", "info", name,
                            f"{name} holds no model.safetensors or pytorch_model.bin; its tensors were not "
                            "compared with the model")]
        out = _listed(self.left, "left-at-init", "warning", lambda k: (
            f"{k}{_also(self.also.get(k, ()))} is not saved in {name} (nor any tensor tied to it): it holds "
            "its random initial value"))
        out += _listed(self.unexpected, "unexpected-tensor", "warning", lambda k: (
            f"{k} is saved in {name} but this model has no such tensor; it was not loaded"))
        out += _listed(self.shape, "shape-changed", "error", lambda s: (
            f"{s[0]} is saved with shape {s[1]} but the model has {s[2]}; it holds its initial value"))
        out += _listed(self.dtype, "dtype-changed", "warning", lambda s: (
            f"{s[0]} is saved as {str(s[1]).removeprefix('torch.')} but the model holds "
            f"{str(s[2]).removeprefix('torch.')}"))
        out += _listed(self.differ, "weight-differs", "warning", lambda k: (
            f"{k} differs from the value saved in {name} (a tie made it share another saved tensor's "
            "value, or loading changed it)"))
        return out


def _also(names: tuple[str, ...]) -> str:
    return f" (the same tensor as {', '.join(names)})" if names else ""


def _listed(items: tuple, code: str, severity: Severity, message: Callable[[Any], str]) -> list[Finding]:
    out = [Finding(code, severity, item if isinstance(item, str) else item[0], message(item))
           for item in items[:MAX_LISTED]]
    if len(items) > MAX_LISTED:
        out.append(Finding(code, severity, "", f"{len(items) - MAX_LISTED} more {code} tensors, not listed"))
    return out


def saved_files(path: Path) -> list[Path]:
    """The weight files of a folder: ``model.safetensors`` (or the shards its index lists), else
    ``pytorch_model.bin`` (or its shards), as transformers looks for them."""
    for index_name, single in WEIGHT_FILES:
        index = path / index_name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise InspectorError(f"{index} is not a readable shard index "
                                     f"({type(exc).__name__}: {exc})") from exc
            return [path / s for s in shards if isinstance(s, str) and Path(s).name == s]
        if (path / single).is_file():
            return [path / single]
    return []


class SavedFiles:
    """The saved tensors of some weight files: names, shapes and dtypes at once, values on request.

    Use as a context manager; files stay open (safetensors) or memory-mapped (torch) inside it.
    """

    def __init__(self, files: list[Path]) -> None:
        self.files = files
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        self._open: list[Any] = []
        self._where: dict[str, Any] = {}

    def __enter__(self) -> SavedFiles:
        from safetensors import safe_open

        try:
            for file in self.files:
                if file.suffix == ".safetensors":
                    fh = safe_open(str(file), framework="pt")
                    self._open.append(fh)
                    for key in fh.keys():
                        piece = fh.get_slice(key)
                        self.shapes[key] = tuple(piece.get_shape())
                        dtype = SAFETENSORS_DTYPES.get(piece.get_dtype())
                        self.dtypes[key] = dtype if dtype is not None else fh.get_tensor(key).dtype
                        self._where[key] = fh
                    continue
                for key, t in _torch_file(file).items():
                    self.shapes[key], self.dtypes[key], self._where[key] = tuple(t.shape), t.dtype, t
        except InspectorError:
            self.__exit__(None, None, None)
            raise
        except Exception as exc:
            self.__exit__(None, None, None)
            raise InspectorError(
                f"reading the tensors saved in {file} failed: {type(exc).__name__}: {exc}"
            ) from exc
        return self

    def value(self, key: str) -> torch.Tensor:
        where = self._where[key]
        return where if isinstance(where, torch.Tensor) else where.get_tensor(key)

    def __exit__(self, *exc: object) -> None:
        self._where.clear()
        for fh in self._open:
            fh.__exit__(None, None, None)
        self._open.clear()


def _torch_file(file: Path) -> Mapping[str, torch.Tensor]:
    """A torch weight file, memory-mapped where its format allows (nothing read until used)."""
    from .checkpoints import read_checkpoint

    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - an old format cannot be mapped, or a refused file: read it plainly
        return read_checkpoint(file)[0]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        return read_checkpoint(file)[0]
    return state


def saved_form(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` under the names ``save_pretrained`` writes: transformers renames some tensors
    on loading (and may merge some), and writes the original names back on saving."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers without weight conversions saves the names it loads
        return dict(state)
    try:
        with torch.no_grad():
            return dict(revert_weight_conversion(model, dict(state)))  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - a conversion that cannot run backwards: compare by name
        return dict(state)


def _candidates(key: str, prefix: str) -> list[str]:
    """Names a saved key may have in the model: itself, with or without the base-model prefix."""
    out = [key]
    if prefix:
        out += [key[len(prefix) + 1:]] if key.startswith(prefix + ".") else [f"{prefix}.{key}"]
    return out


def check_saved(model: nn.Module, path: Path, loading: Mapping[str, Any] | None = None) -> SavedCheck:
    """Compare the tensors saved in ``path`` with ``model``'s state dict.

    A model tensor not saved under its own name counts as filled when a tensor it is tied to
    (the same object) was saved, or when transformers' conversion mapping builds it from saved
    tensors (merged experts: :func:`saved_origins`). Tensors the class rebuilds at init and
    never saves (``_keys_to_ignore_on_save``, ``_keys_to_ignore_on_load_missing``: sinusoidal
    positions) are not left at init.

    Args:
        model: the model, loaded from ``path`` or not.
        path: a Hugging Face model folder.
        loading: what ``from_pretrained`` with ``output_loading_info=True`` returned with ``model``
            (``missing_keys``, ``mismatched_keys``, ``error_msgs``). With it, the tensors left at
            init are the ones it reports missing, and values are read only for saved tensors that
            share one model tensor and for model tensors the report says were not loaded; without
            it (the model may have changed since), every saved value.
    """
    files = saved_files(path)
    if not files:
        return SavedCheck(path.name, checked=False)
    own = model.state_dict(keep_vars=True)
    names_of: dict[int, list[str]] = {}
    for key, t in own.items():
        names_of.setdefault(id(t), []).append(key)
    expected = saved_form(model, own)
    origin = saved_origins(model, own, expected, names_of)
    prefix = getattr(model, "base_model_prefix", "") or ""
    with SavedFiles(files) as saved:
        placed: dict[str, str] = {}  # saved key -> name in `expected`
        unexpected = []
        for key in saved.shapes:
            name = next((c for c in _candidates(key, prefix) if c in expected), None)
            if name is None:
                unexpected.append(key)
            else:
                placed[key] = name
        to_read = _values_to_read(placed, expected, names_of, loading, origin)
        shape, dtype, differ = [], [], []
        for key, name in placed.items():
            t, where = expected[name], origin.get(name, name)
            if tuple(t.shape) != saved.shapes[key]:
                shape.append((where, saved.shapes[key], tuple(t.shape)))
            elif t.dtype != saved.dtypes[key]:
                dtype.append((where, saved.dtypes[key], t.dtype))
            elif (
                key in to_read
                and t.device.type != "meta"
                and not torch.equal(t.detach().cpu(), saved.value(key))
            ):
                differ.append(where)
    left = _left_at_init(model, names_of, {origin.get(n, n) for n in placed.values()}, loading)
    also = {k: tuple(a for a in names_of[id(own[k])] if a != k) for k in left}
    return SavedCheck(
        path.name,
        True,
        tuple(unexpected),
        tuple(left),
        tuple(shape),
        tuple(dtype),
        tuple(differ),
        values_read=len(to_read),
        also={k: v for k, v in also.items() if v},
    )


def saved_origins(model: nn.Module, own: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor],
                  names_of: Mapping[int, list[str]]) -> dict[str, str]:
    """Each name of ``expected`` (the saved form) -> the first model name of the tensor it comes from.

    By identity where the saved form keeps the model's tensor; otherwise transformers' conversion
    mapping is run backwards on each converted model tensor alone (a merged ``experts.gate_up_proj``
    gives every expert's ``gate_proj`` and ``up_proj``), since a conversion builds new tensors.
    """
    out = {name: names_of[id(t)][0] for name, t in expected.items() if id(t) in names_of}
    for key, t in own.items():
        if key in expected or names_of[id(t)][0] != key:
            continue
        for name in saved_form(model, {key: torch.empty_like(t, device="meta")}):  # names only: no copy
            out.setdefault(name, key)
    return out


def _left_at_init(model: nn.Module, names_of: Mapping[int, list[str]],
                  filled: set[str], loading: Mapping[str, Any] | None) -> list[str]:
    """The first name of each model tensor that holds its initial value: no saved tensor filled it
    (by name, tie or conversion), and transformers' loading report says it is missing (without a
    report: the class does not rebuild it itself, as it does sinusoidal positions)."""
    unfilled = [names for names in names_of.values() if not filled.intersection(names)]
    if loading is not None and not loading.get("error_msgs"):
        missing = set(loading.get("missing_keys") or ())
        return [names[0] for names in unfilled if missing.intersection(names)]
    ignore = _ignore_pattern(model)
    return [names[0] for names in unfilled if not (ignore and all(ignore.search(n) for n in names))]


def _ignore_pattern(model: nn.Module) -> re.Pattern[str] | None:
    """The tensors the class does not save or rebuilds at init (sinusoidal positions...)."""
    patterns = [p for attr in ("_keys_to_ignore_on_save", "_keys_to_ignore_on_load_missing")
                for p in (getattr(model, attr, None) or ()) if isinstance(p, str)]
    return re.compile("|".join(f"({p})" for p in patterns)) if patterns else None


def _values_to_read(placed: dict[str, str], expected: dict[str, torch.Tensor], names_of: dict[int, list[str]],
                    loading: Mapping[str, Any] | None, origin: Mapping[str, str]) -> set[str]:
    """The saved keys whose values must be compared: all without a loading report; with one, those
    that fill a model tensor another saved key fills too (a tie), and those that fill a tensor the
    report says was not loaded (missing, or another shape)."""
    if loading is None or loading.get("error_msgs"):
        return set(placed)
    not_loaded = set(loading.get("missing_keys") or ()) | {m[0] for m in loading.get("mismatched_keys") or ()}
    keys_of: dict[int, list[str]] = {}
    for key, name in placed.items():
        keys_of.setdefault(id(expected[name]), []).append(key)
    out: set[str] = set()
    for ident, keys in keys_of.items():
        names = names_of.get(ident) or [origin.get(placed[keys[0]], placed[keys[0]])]
        if len(keys) > 1 or not_loaded.intersection(names):
            out.update(keys)
    return out


def compare_saved(model: nn.Module, path: Path, loading: Mapping[str, Any] | None = None) -> list[Finding]:
    """The findings of :func:`check_saved`: one per tensor that is not as saved."""
    return check_saved(model, path, loading).findings()
