"""The conversion check: run a conversion (``.to``, ``load_state_dict(assign=True)``, safetensors...)
on a copy of a model and report what became of every tie."""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..inventory import TensorInventory, tensor_inventory
from ..loading.devices import move_model
from ..utils.checks import require_module
from ..utils.findings import Finding, InspectorError
from ..utils.locks import model_lock
from .ties import GroupOutcome, TieSnapshot, _outcome_findings, outcomes, retie, snapshot_inventory


@contextmanager
def overwrite_on_conversion(value: bool = True) -> Iterator[None]:
    """Set torch's process-wide overwrite-on-conversion flag for a block, and restore it after."""
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    torch.__future__.set_overwrite_module_params_on_conversion(value)
    try:
        yield
    finally:
        torch.__future__.set_overwrite_module_params_on_conversion(before)


@dataclass(frozen=True)
class Conversion:
    """A named conversion to try on a copy of a model; ``run(model, device)`` returns the result."""

    name: str
    label: str
    run: Callable[[nn.Module, torch.device], nn.Module] = field(repr=False)
    needs_data: bool = False   # reads or writes values (not possible on the meta device)
    allocates: float = 0.0     # memory it allocates, as a multiple of the model's bytes


def _to_dtype(dtype: torch.dtype, overwrite: bool) -> Callable[[nn.Module, torch.device], nn.Module]:
    def run(m: nn.Module, dev: torch.device) -> nn.Module:
        with overwrite_on_conversion(overwrite):
            return m.to(dtype)
    return run


def _to_device(m: nn.Module, dev: torch.device) -> nn.Module:
    with overwrite_on_conversion(True):
        return m.to(dev)


def _to_device_plain(m: nn.Module, dev: torch.device) -> nn.Module:
    return m.to(dev)


def _cuda(m: nn.Module, dev: torch.device) -> nn.Module:
    if dev.type != "cuda":
        raise InspectorError(f"Module.cuda() moves to a CUDA device; the target here is {dev}. "
                             "Pick a cuda:N device for this conversion.")
    return m.cuda(dev)


def _move(dtype: torch.dtype) -> Callable[[nn.Module, torch.device], nn.Module]:
    def run(m: nn.Module, dev: torch.device) -> nn.Module:
        with overwrite_on_conversion(True):
            return move_model(m, dtype=dtype)
    return run


def _move_device(m: nn.Module, dev: torch.device) -> nn.Module:
    with overwrite_on_conversion(True):
        return move_model(m, device=dev)


def _assign(m: nn.Module, dev: torch.device) -> nn.Module:
    m.load_state_dict(m.state_dict(), assign=True)
    return m


def _safetensors_file(m: nn.Module, dev: torch.device) -> nn.Module:
    from safetensors.torch import load_file, save_file

    state = m.state_dict()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        try:
            save_file(state, path)
        except RuntimeError:
            # save_file refuses tensors that share memory; the usual workaround is a copy of each
            save_file({k: v.detach().clone().contiguous() for k, v in state.items()}, path)
        m.load_state_dict(load_file(path, device=str(dev)), assign=True)
    return m


def _safetensors_model(m: nn.Module, dev: torch.device) -> nn.Module:
    from safetensors.torch import load_model, save_model

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.safetensors")
        save_model(m, path)
        load_model(m, path, device=str(dev))
    return m


def _to_empty(m: nn.Module, dev: torch.device) -> nn.Module:
    return m.to_empty(device=dev)


CONVERSIONS: dict[str, Conversion] = {c.name: c for c in [
    Conversion("to-float64", ".to(float64), default flags", _to_dtype(torch.float64, False), allocates=2),
    Conversion("to-float64-overwrite", "overwrite flag + .to(float64)", _to_dtype(torch.float64, True),
               allocates=2),
    Conversion("to-float32-overwrite", "overwrite flag + .to(float32)", _to_dtype(torch.float32, True),
               allocates=1),
    Conversion("to-device", ".to(device), default flags (each buffer moved on its own: views break)",
               _to_device_plain, needs_data=True, allocates=1),
    Conversion("cuda", "Module.cuda(), default flags (each buffer moved on its own: views break)", _cuda,
               needs_data=True, allocates=1),
    Conversion("to-device-overwrite", "overwrite flag + .to(device)", _to_device, needs_data=True,
               allocates=1),
    Conversion("move-model-float64", "overwrite flag + move_model(dtype=float64)", _move(torch.float64),
               allocates=2),
    Conversion("move-model-float32", "overwrite flag + move_model(dtype=float32)", _move(torch.float32),
               allocates=1),
    Conversion("move-model-device", "overwrite flag + move_model(device)", _move_device, needs_data=True,
               allocates=1),
    Conversion("load-state-dict-assign", "load_state_dict(own state dict, assign=True)", _assign),
    Conversion("safetensors-file", "safetensors save_file/load_file + load_state_dict(assign=True)",
               _safetensors_file, needs_data=True, allocates=2),
    Conversion("safetensors-model", "safetensors save_model/load_model", _safetensors_model,
               needs_data=True, allocates=2),
    Conversion("deepcopy", "copy.deepcopy", lambda m, dev: copy.deepcopy(m), allocates=1),
    Conversion("to-empty", "to_empty(device)", _to_empty, needs_data=True, allocates=1),
]}


@dataclass(frozen=True)
class ConversionResult:
    """What one conversion did to every alias group of a copy of the model.

    ``error`` is set (and ``outcomes`` empty) when the conversion could not run; ``retied``
    and ``after_retie`` are filled when a re-tie was asked for.
    """

    conversion: str
    label: str
    device: str
    unique_before: int
    unique_after: int | None
    outcomes: tuple[GroupOutcome, ...]
    findings: tuple[Finding, ...]
    error: str | None = None
    retied: tuple[Finding, ...] = ()
    unique_after_retie: int | None = None
    after_retie: tuple[GroupOutcome, ...] = ()

    @property
    def ok(self) -> bool:
        return self.error is None and all(o.outcome == "kept" for o in self.outcomes)

    def to_dict(self) -> dict:
        return {"conversion": self.conversion, "label": self.label, "device": self.device,
                "unique_before": self.unique_before, "unique_after": self.unique_after,
                "outcomes": [o.to_dict() for o in self.outcomes],
                "findings": [f.to_dict() for f in self.findings], "error": self.error,
                "retied": [f.to_dict() for f in self.retied],
                "unique_after_retie": self.unique_after_retie,
                "after_retie": [o.to_dict() for o in self.after_retie]}

    def to_frame(self) -> pd.DataFrame:
        """One row per alias group (one row with the error, if it failed)."""
        return _result_rows([self])


def _target_device(inv: TensorInventory, device: str | torch.device | None) -> torch.device:
    if device is not None:
        from ..loading.devices import resolve_device

        return resolve_device(device)
    for e in inv.unique_entries():
        return torch.device("cpu") if e.device.type == "meta" else e.device
    return torch.device("cpu")


def conversion_check(model: nn.Module, conversion: str, device: str | torch.device | None = None,
                     retie_after: bool = False, max_bytes: int = 4 << 30) -> ConversionResult:
    """Run ``conversion`` on a deep copy of ``model`` and report what became of each tie.

    The model itself is never changed; torch's overwrite flag is restored whatever happens.

    Args:
        model: the model to check.
        conversion: a key of :data:`CONVERSIONS`.
        device: target of ``to-device``, ``cuda``, ``to-device-overwrite``, ``to-empty`` and the
            safetensors loads
            (default: the model's device; cpu for a meta model).
        retie_after: also run :func:`retie` on the converted copy and report the result.
        max_bytes: refuse conversions that would allocate more than this.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> r = conversion_check(m, "to-float64-overwrite")
    >>> r.outcomes[0].outcome, r.unique_before, r.unique_after
    ('broken', 4, 8)
    """
    model = require_module(model, "conversion_check")
    conv = _conversion(conversion)
    inv = tensor_inventory(model)
    return _check(
        model, conv, _target_device(inv, device), inv, snapshot_inventory(inv), retie_after, max_bytes
    )


def _conversion(name: str) -> Conversion:
    conv = CONVERSIONS.get(name)
    if conv is None:
        raise InspectorError(f"unknown conversion {name!r}; choose one of {', '.join(CONVERSIONS)}")
    return conv


def _refusal(conv: Conversion, inv: TensorInventory, max_bytes: int) -> str | None:
    """Why ``conv`` is not run on a copy of the model walked by ``inv``, or None."""
    if any(e.is_dtensor for e in inv.unique_entries()):
        return (
            "skipped: the parameters are DTensors (FSDP2 or tensor parallel), and a sharded module cannot "
            "be copied to convert; check the conversion on the model before sharding it"
        )
    on_meta = inv.has_meta()
    size = inv.unique_bytes()
    need = (size if on_meta and conv.needs_data else 0) + (0 if on_meta else size * (1 + conv.allocates))
    if on_meta and conv.needs_data and conv.name not in ("to-empty", "to-device-overwrite"):
        return "the model is on the meta device: it has no values to save or load"
    if need > max_bytes:
        return (f"would allocate about {need / 2**30:.1f} GiB, more than the "
                f"{max_bytes / 2**30:.1f} GiB allowed for a conversion check")
    return None


def _check(model: nn.Module, conv: Conversion, dev: torch.device, inv: TensorInventory, snap: TieSnapshot,
           retie_after: bool, max_bytes: int) -> ConversionResult:
    """:func:`conversion_check` with the model's inventory and snapshot already made."""
    base: dict[str, Any] = dict(
        conversion=conv.name, label=conv.label, device=str(dev), unique_before=snap.unique_numel
    )
    error = _refusal(conv, inv, max_bytes)
    if error is not None:
        return ConversionResult(**base, unique_after=None, outcomes=(), findings=(), error=error)
    try:
        with model_lock(model):
            work = copy.deepcopy(model)  # a sparse parameter cannot be deep-copied: a result too
        work = conv.run(work, dev)
    except Exception as exc:  # noqa: BLE001 - a failing conversion is a result, not a crash
        msg = str(exc).strip().splitlines()
        return ConversionResult(**base, unique_after=None, outcomes=(), findings=(),
                                error=f"{type(exc).__name__}: {msg[0] if msg else ''}")
    after_inv = tensor_inventory(work)
    after = outcomes(snap, after_inv.tensors())
    findings = [replace(f, message=f"After {base['label']}: {f.message}")
                for f in _outcome_findings(after, snap.unique_numel, after_inv.unique_numel())]
    result = ConversionResult(**base, unique_after=after_inv.unique_numel(), outcomes=tuple(after),
                              findings=tuple(findings))
    return _retie_copy(work, snap, result) if retie_after else result


def _retie_copy(work: nn.Module, snap: TieSnapshot, result: ConversionResult) -> ConversionResult:
    """``result`` with what :func:`retie` restored on the converted copy ``work``."""
    try:
        retied = retie(work, snap)
    except InspectorError as exc:
        retied = [Finding("retie-refused", "warning", "", str(exc))]
    inv = tensor_inventory(work)
    return replace(result, retied=tuple(retied), unique_after_retie=inv.unique_numel(),
                   after_retie=tuple(outcomes(snap, inv.tensors())))


_TABLE_COLUMNS = ["conversion", "group", "outcome", "same_object", "same_storage", "unique", "error"]


def _result_rows(results: list[ConversionResult], retied: bool = False) -> pd.DataFrame:
    rows = []
    for r in results:
        outcomes = r.after_retie if retied else r.outcomes
        unique = r.unique_after_retie if retied else r.unique_after
        label = r.label + (" + retie" if retied else "")
        if r.error is not None or not outcomes:
            rows.append({"conversion": label, "group": "", "outcome": "error" if r.error else "no ties",
                         "same_object": None, "same_storage": None, "unique": unique, "error": r.error})
        for o in outcomes:
            rows.append({"conversion": label, "group": ", ".join(o.names), "outcome": o.outcome,
                         "same_object": o.same_object, "same_storage": o.same_storage, "unique": unique,
                         "error": None})
    return pd.DataFrame(rows, columns=_TABLE_COLUMNS)


def conversion_table(model: nn.Module, conversions: list[str] | None = None,
                     device: str | torch.device | None = None,
                     retie_after: bool = False) -> tuple[pd.DataFrame, list[ConversionResult]]:
    """The conversion check for several conversions, as one table with a ``before`` row per group.

    Columns: ``conversion, group, outcome, same_object, same_storage, unique, error``.
    With ``retie_after``, each conversion that split a tie gets a second row set after re-tying.
    """
    model = require_module(model, "conversion_table")
    inv = tensor_inventory(model)
    snap = snapshot_inventory(inv)
    dev = _target_device(inv, device)
    convs = [_conversion(name) for name in (conversions or list(CONVERSIONS))]
    results = [_check(model, conv, dev, inv, snap, retie_after, 4 << 30) for conv in convs]
    start = ConversionResult("before", "before", str(dev), snap.unique_numel, snap.unique_numel,
                             tuple(outcomes(snap, inv.tensors())), ())
    frames = [_result_rows([start])]
    for r in results:
        frames.append(_result_rows([r]))
        if retie_after and r.retied:
            frames.append(_result_rows([r], retied=True))
    table = pd.concat(frames, ignore_index=True)
    table.loc[table["conversion"] == "before", "outcome"] = "-"
    return table, results
