"""Apply a device map with accelerate, audit where tensors end up, try it on a copy."""

from __future__ import annotations

import copy
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..inventory import TensorInventory, tensor_inventory
from ..utils.checks import require_module
from ..utils.findings import Finding, InspectorError
from ..utils.locks import model_lock
from .audits import audit_inventory, normalise_map, placement_table
from .budget import Device, device_order, main_device
from .map_findings import table_findings
from .plan import default_no_split
from .walk import largest_layer


@dataclass
class Dispatched:
    """A model dispatched by accelerate, with the audit of where its tensors really are.

    ``in_place`` says whether ``model`` is the caller's model (changed) or a copy. Call
    :meth:`close` (or use it as a context manager) to delete a temporary offload folder.
    """

    model: nn.Module
    device_map: dict[str, Device]
    table: pd.DataFrame
    findings: list[Finding]
    offload_folder: str | None
    in_place: bool
    _tmp: Any = field(default=None, repr=False)

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Dispatched:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def validate_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> dict[str, Device]:
    """The map normalised, or an InspectorError for unknown keys, overlaps and unplaced tensors.

    >>> validate_device_map(nn.Linear(2, 2), {"": "cuda:0"})
    {'': 0}
    """
    return _validated(tensor_inventory(model, what="audit"), device_map)


def _validated(inv: TensorInventory, device_map: Mapping[str, Any]) -> dict[str, Device]:
    """:func:`validate_device_map` of the model walked by ``inv``."""
    result = audit_inventory(inv, device_map)
    dm = normalise_map(device_map)
    problems = [f for f in result.findings if f.code in ("unknown-key", "overlapping-key")]
    unplaced = result.table.loc[result.table["device"].isna(), "name"].tolist()
    if problems:
        raise InspectorError("the device map cannot be used: " + "; ".join(f.message for f in problems[:5]))
    if unplaced:
        raise InspectorError(f"the device map gives no device to {len(unplaced)} tensors "
                             f"({', '.join(unplaced[:6])}{', ...' if len(unplaced) > 6 else ''}); "
                             "add keys for them or plan with plan_device_map")
    return dm


def missing_devices(device_map: Mapping[str, Any]) -> list[Device]:
    """The devices a map uses that this machine does not have (disk and cpu are always here).

    >>> missing_devices({"a": "cpu", "b": "disk"})
    []
    """
    out: list[Device] = []
    for dev in sorted(set(normalise_map(device_map).values()), key=device_order):
        if isinstance(dev, int) and not (torch.cuda.is_available() and dev < torch.cuda.device_count()):
            out.append(dev)
        elif dev == "mps" and not (
            getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()
        ):
            out.append(dev)
    return out


def _check_devices_exist(dm: Mapping[str, Device]) -> None:
    missing = missing_devices(dm)
    if missing:
        raise InspectorError(f"the map uses {', '.join(map(repr, missing))}, which this machine does not "
                             "have; plan for the devices here (e.g. cpu and disk) to dispatch")


def _root_parts_on_disk(inv: TensorInventory, dm: dict[str, Device]) -> dict[str, Device]:
    """The map with a root key on disk replaced by the root's parts (its children, as
    ``named_children()`` yields them, and its own tensors), all on disk.

    accelerate cannot offload the root key itself (it finds no tensors under ``""``).
    """
    if dm.get("") != "disk":
        return dm
    out = {k: v for k, v in dm.items() if k}
    seen: set[int] = set()
    for n, m in zip(inv.modules, inv.module_objects, strict=True):
        if n and "." not in n and id(m) not in seen:  # a child of the root, each object once
            seen.add(id(m))
            out[n] = "disk"
    out.update({e.name: "disk" for e in inv.own_entries.get("", ()) if not e.is_alias})
    return out


def _move_tensor_keys(target: nn.Module, dm: Mapping[str, Device], modules: set[str]) -> None:
    """Move the tensors the map names directly (not modules) to their device, in place.

    ``dispatch_model`` places and offloads whole modules only: a tensor key (a split module's
    own buffer) is moved here, and one mapped to disk stays in memory on the device where disk
    layers run. ``modules``: the module names of ``target``.
    """
    from accelerate.utils import set_module_tensor_to_device

    main = main_device(dm.values())
    for key, dev in dm.items():
        if key not in modules:
            dev = main if dev == "disk" else dev
            set_module_tensor_to_device(target, key, f"cuda:{dev}" if isinstance(dev, int) else dev)


def dispatch_plan(model: nn.Module, device_map: Mapping[str, Any], *, offload_folder: str | None = None,
                  in_place: bool = False) -> Dispatched:
    """Apply a device map with ``accelerate.dispatch_model`` and audit where tensors end up.

    By default a deep copy of ``model`` is dispatched and the model passed in is left as it
    was; with ``in_place=True`` the model itself is changed (hooks added, tensors moved or
    offloaded). Tensors the map names directly (a split module's own buffers) are moved to
    their device first, since ``dispatch_model`` only places whole modules. Disk offload
    uses ``offload_folder``, or a temporary folder deleted by :meth:`Dispatched.close`.

    Raises:
        InspectorError: unknown or overlapping keys, tensors without a device, devices this
            machine lacks, or a model on the meta device.

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    >>> with dispatch_plan(m, {"0": "cpu", "1": "disk"}) as d:
    ...     sorted(set(d.table["device"]))
    ['cpu', 'disk']
    """
    from accelerate import dispatch_model

    from ..loading.models import ensure_runnable

    model = require_module(model, "dispatch_plan")
    inv = tensor_inventory(model)
    dm = _validated(inv, device_map)
    _check_devices_exist(dm)
    dm = _root_parts_on_disk(inv, dm)
    ensure_runnable(model, inv=inv)
    with model_lock(model):
        target = model if in_place else copy.deepcopy(model)
    tmp = None
    if "disk" in dm.values() and offload_folder is None:
        tmp = tempfile.TemporaryDirectory(prefix="inspector-offload-")
        offload_folder = tmp.name
    try:
        with model_lock(target):
            _move_tensor_keys(target, dm, set(inv.modules))  # a copy: the same names
            with warnings.catch_warnings():
                # check_device_map warns that tensor-name keys are not module names: expected here
                warnings.filterwarnings(
                    "ignore", message="The following device_map keys", category=UserWarning
                )
                dispatch_model(target, device_map=dict(dm), offload_dir=offload_folder)
    except Exception:
        if tmp is not None:
            tmp.cleanup()
        raise
    table = placement_table(target)
    return Dispatched(target, dm, table, table_findings(table), offload_folder, in_place, tmp)


@dataclass(frozen=True)
class DispatchCheck:
    """What :func:`try_dispatch` saw: where the copy's tensors are, and whether outputs agree."""

    table: pd.DataFrame = field(repr=False)
    findings: list[Finding]
    outputs_equal: bool
    max_abs_difference: float
    message: str


def try_dispatch(loaded: Any, device_map: Mapping[str, Any]) -> DispatchCheck:
    """Dispatch a copy of a loaded model by ``device_map`` and compare outputs with the original.

    The original runs its example inputs under its lock; the copy (hooks, offload folder and all)
    is thrown away afterwards, so the loaded model is unchanged.
    """
    from ..loading.models import call_model, to_device
    from ..utils.forward_state import module_state_kept

    loaded.check_runnable()
    inputs = loaded.example_inputs(2)
    with loaded.lock, torch.no_grad(), module_state_kept(list(loaded.model.named_modules())):
        expected = call_model(loaded.model, inputs)
    with dispatch_plan(loaded.model, device_map) as d, torch.no_grad():
        got = call_model(d.model, inputs)
        table, findings = d.table, d.findings
    expected = expected if isinstance(expected, torch.Tensor) else getattr(expected, "logits", expected[0])
    got = got if isinstance(got, torch.Tensor) else getattr(got, "logits", got[0])
    got = to_device(got, expected.device)
    diff = float((got.float() - expected.float()).abs().max()) if expected.numel() else 0.0
    equal = bool(torch.equal(got, expected))
    message = ("the dispatched copy gives exactly the same outputs" if equal else
               f"the dispatched copy's outputs differ by up to {diff:.3g}")
    return DispatchCheck(table, findings, equal, diff, message)


def suggest_budget(model: nn.Module) -> dict[Device, int]:
    """A budget that splits the model: two GPUs with 55% of its bytes each, cpu with twice them.

    GPU 0 also gets room for the largest layer, which it keeps free for offloaded layers.

    >>> suggest_budget(nn.Linear(10, 10))  # 440 bytes, one layer
    {0: 682, 1: 242, 'cpu': 880}
    """
    inv = tensor_inventory(model).module_tables()
    total = inv.sizes[""]
    _, largest = largest_layer(inv, set(default_no_split(model, None)))
    return {0: int(total * 0.55) + largest, 1: int(total * 0.55), "cpu": 2 * total}
