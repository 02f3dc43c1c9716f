"""Audit any device map, and where a model's tensors really are, one row per tensor name."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
from torch import nn

from ..inventory import TensorEntry, TensorInventory, tensor_inventory
from ..utils.dtensors import has_dtensors
from ..utils.findings import Finding, InspectorError
from .budget import Device, device_order, main_device, normalise_device, offload_devices, torch_device_key
from .inventory import lookup
from .map_findings import key_findings, table_findings

AUDIT_COLUMNS = ["name", "kind", "module", "device", "module_primary_device", "split", "finding",
                 "bytes", "alias_of"]


@dataclass(frozen=True)
class DeviceMapAudit:
    """One row per parameter and buffer name (``table``), plus findings about the map's keys."""

    table: pd.DataFrame
    findings: list[Finding]


def normalise_map(device_map: Mapping[str, Any]) -> dict[str, Device]:
    """Keys as strings, devices in accelerate's format; bad devices raise InspectorError."""
    if not isinstance(device_map, Mapping):
        raise InspectorError(
            f"a device map is a mapping of names to devices, not {type(device_map).__name__}"
        )
    out: dict[str, Device] = {}
    for key, value in device_map.items():
        if not isinstance(key, str):
            raise InspectorError(f"device map key {key!r} is not a module or tensor name (a string)")
        try:
            out[key] = normalise_device(value)
        except InspectorError as exc:
            raise InspectorError(f"device map key {key!r}: {exc}") from None
    return out


def load_device_map(text: str, source: str = "device map") -> dict[str, Device]:
    """Parse a JSON device map (``{"embed": 0, "block.fc1": "cpu"}``).

    >>> load_device_map('{"": "cuda:0"}')
    {'': 0}
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InspectorError(
            f"{source} is not valid JSON: {exc.msg} at line {exc.lineno}, "
            f'column {exc.colno}; write it like {{"embed": 0, "head": "cpu"}}'
        ) from None
    except RecursionError:
        raise InspectorError(
            f"{source} nests brackets too deeply to read; a device map is one flat JSON object "
            "of names to devices"
        ) from None
    if not isinstance(data, dict):
        raise InspectorError(f"{source} must be a JSON object of names to devices, not {type(data).__name__}")
    return normalise_map(data)


Chains = dict[str, tuple[str, ...]]  # module -> the modules above it and itself that hold tensors


def _tensor_rows(tensors: TensorInventory) -> tuple[list[TensorEntry], Chains]:
    """Every parameter and buffer name of the walked model, in module order (a module's
    parameters, then its buffers, then its children's), and each owning module's chain of
    owning modules from the root down (itself last)."""
    rows: list[TensorEntry] = []
    own = tensors.own_entries
    chains: Chains = {"": ("",) if "" in own else ()}
    for mname in tensors.modules:
        if mname:
            chain = chains[mname.rpartition(".")[0]]
            mine = own.get(mname)
            if mine is None:
                chains[mname] = chain
                continue
            chains[mname] = chain + (mname,)
        else:
            mine = own.get("", [])
        rows += mine
    return rows, chains


def _module_devices(
    rows: list[TensorEntry],
    chains: Chains,
    device_of: list[Device | None],
    devices: list[Device],
    nbytes: list[int],
) -> tuple[dict[str, Device], dict[str, set], dict[str, Device | None]]:
    """Per owning module: its primary device and every device its tensors use; each leader's device.

    The primary device holds most of the module's parameter bytes (the earlier device on a tie).
    """
    per: dict[str, dict[Device, int]] = {}
    seen: dict[str, set] = {}
    leader_dev: dict[str, Device | None] = {}
    for r, dev, n in zip(rows, device_of, nbytes, strict=True):
        is_leader = r.name == r.first_name
        if is_leader:
            leader_dev[r.name] = dev
        for m in chains[r.module]:
            bucket = seen.get(m)
            if bucket is None:
                bucket = seen[m] = set()
                per[m] = {}
            bucket.add(dev)
            if is_leader and dev is not None and r.kind == "parameter":
                pm = per[m]
                pm[dev] = pm.get(dev, 0) + n
    rank = {d: i for i, d in enumerate(devices)}
    primary = {m: max(b, key=lambda d: (b[d], -rank.get(d, len(rank)))) for m, b in per.items() if b}
    return primary, seen, leader_dev


def _audit_rows(
    rows: list[TensorEntry],
    chains: Chains,
    device_of: list[Device | None],
    devices: list[Device],
    meta_ok: bool = False,
    dispatched: bool = False,
) -> pd.DataFrame:
    """The audit table, given each row's device (None: unassigned).

    With ``dispatched`` (real placement after accelerate's hooks), a buffer is not stranded
    when its module's parameters are offloaded (disk, or cpu behind a GPU) and the buffer sits
    on the device those layers run on: accelerate keeps buffers there unless told otherwise.
    """
    main = main_device(devices)
    offload = offload_devices(main) if dispatched else set()
    nbytes = [r.tensor.numel() * r.tensor.element_size() for r in rows]
    primary, seen, leader_dev = _module_devices(rows, chains, device_of, devices, nbytes)
    findings, primaries, splits, aliases = [], [], [], []
    for r, dev in zip(rows, device_of, strict=True):
        prim = primary.get(r.module)
        codes = []
        if dev is None:
            codes.append("param-unplaced" if r.kind == "parameter" else "buffer-unplaced")
        elif dev == "meta" and not meta_ok:
            codes.append("meta-leftover")
        alias = None if r.name == r.first_name else r.first_name
        if alias is not None and dev != leader_dev[alias]:
            codes.append("tie-split")
        if r.kind == "buffer" and prim is not None and dev != prim and dev not in (None, "meta") \
                and not (prim in offload and dev == main):
            codes.append("buffer-stranded")
        findings.append(",".join(codes) if codes else None)
        primaries.append(prim)
        splits.append(len(seen[r.module]) > 1)
        aliases.append(alias)
    columns = {"name": [r.name for r in rows], "kind": [r.kind for r in rows],
               "module": [r.module for r in rows], "device": device_of, "module_primary_device": primaries,
               "split": splits, "finding": findings, "bytes": nbytes, "alias_of": aliases}
    typed = {"split": bool, "bytes": "int64"}
    return pd.DataFrame({c: pd.Series(v, dtype=typed.get(c, object)) for c, v in columns.items()})


def _map_devices(rows: list[TensorEntry], dm: Mapping[str, Device]) -> list[Device | None]:
    """Each row's device under the map: its own key, else the key covering its module."""
    by_module: dict[str, Device | None] = {}
    out = []
    for r in rows:
        dev = dm.get(r.name)
        if dev is None and r.name not in dm:
            dev = by_module.get(r.module, _MISSING)
            if dev is _MISSING:
                dev = by_module[r.module] = lookup(dm, r.module)[1]
        out.append(dev)
    return out


_MISSING: Any = object()


def audit_device_map(model: nn.Module, device_map: Mapping[str, Any]) -> pd.DataFrame:
    """Where a device map sends every parameter and buffer name, and what is wrong with it.

    Works for any map: ours, accelerate's, a model's ``hf_device_map``, one read from JSON.
    Columns: ``name, kind, module, device`` (None where the map gives none),
    ``module_primary_device`` (the device with most of the owning module's parameter
    bytes), ``split`` (the owning module's tensors are on more than one device), ``finding``
    (comma-separated codes: ``param-unplaced``, ``buffer-unplaced``, ``tie-split``,
    ``buffer-stranded``), then ``bytes`` and ``alias_of``. Findings about the keys themselves
    (``unknown-key``, ``overlapping-key``) come from :func:`audit`.

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    >>> audit_device_map(m, {"0": 0, "1.weight": 0, "1.bias": 0})["finding"].dropna().tolist()
    ['buffer-unplaced', 'buffer-unplaced', 'buffer-unplaced']
    """
    return audit_table(tensor_inventory(model, what="audit_device_map"), device_map)


def audit_table(tensors: TensorInventory, device_map: Mapping[str, Any]) -> pd.DataFrame:
    """:func:`audit_device_map` of the model walked by ``tensors``."""
    dm = normalise_map(device_map)
    rows, chains = _tensor_rows(tensors)
    return _audit_rows(rows, chains, _map_devices(rows, dm), sorted(set(dm.values()), key=device_order))


def audit(model: nn.Module, device_map: Mapping[str, Any]) -> DeviceMapAudit:
    """:func:`audit_device_map` plus findings (rows and keys), most severe first.

    >>> audit(nn.Linear(2, 2), {"weight": 0, "bias": 0, "nope": 1}).findings[0].code
    'unknown-key'
    """
    return audit_inventory(tensor_inventory(model, what="audit"), device_map)


def audit_inventory(tensors: TensorInventory, device_map: Mapping[str, Any]) -> DeviceMapAudit:
    """:func:`audit` of the model walked by ``tensors``."""
    dm = normalise_map(device_map)
    rows, chains = _tensor_rows(tensors)
    table = _audit_rows(rows, chains, _map_devices(rows, dm), sorted(set(dm.values()), key=device_order))
    names = set(tensors.modules) | {r.name for r in rows}
    return DeviceMapAudit(table, key_findings(names, dm) + table_findings(table))


def audit_findings(model: nn.Module, device_map: Mapping[str, Any]) -> list[Finding]:
    """The findings of :func:`audit`.

    >>> [f.code for f in audit_findings(nn.Linear(2, 2), {"weight": 0})]
    ['param-unplaced']
    """
    return audit(model, device_map).findings


def device_usage(table: pd.DataFrame, budget: Mapping[Device, int] | None = None,
                 reserve: Mapping[Device, int] | None = None) -> pd.DataFrame:
    """Bytes per device from an audit or placement table (each tensor object counted once).

    Columns: ``device, parameter_bytes, buffer_bytes, total_bytes, budget_bytes, reserved_bytes``;
    unassigned tensors are on the row whose device is None.

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))  # params 24 + 16, buffers 16 + 8
    >>> usage = device_usage(audit_device_map(m, {"": "cpu"}))
    >>> usage[["device", "parameter_bytes", "buffer_bytes"]].values.tolist()
    [['cpu', 40, 24]]
    """
    unique = table[table["alias_of"].isna()]
    devices = list(budget or [])
    for d in unique["device"].tolist():
        if d not in devices:
            devices.append(d)
    rows = []
    for d in devices:
        mine = unique[unique["device"].map(lambda x, d=d: x == d if d is not None else x is None)]
        p = int(mine.loc[mine["kind"] == "parameter", "bytes"].sum())
        b = int(mine.loc[mine["kind"] == "buffer", "bytes"].sum())
        rows.append((d, p, b, p + b, None if budget is None else budget.get(d),
                     0 if reserve is None else reserve.get(d, 0)))
    df = pd.DataFrame(rows, columns=["device", "parameter_bytes", "buffer_bytes", "total_bytes",
                                     "budget_bytes", "reserved_bytes"])
    return df.astype({"device": object})


# ----------------------------------------------------------------------------- actual placement

def _hooks(module: nn.Module) -> list[Any]:
    hook = getattr(module, "_hf_hook", None)
    if hook is None:
        return []
    return list(getattr(hook, "hooks", [hook]))


def _offloaded_device(module: nn.Module, local: str) -> Device | None:
    """'cpu' or 'disk' when accelerate's hooks keep this tensor's values off the model."""
    for hook in _hooks(module):
        wmap = getattr(hook, "weights_map", None)
        if not getattr(hook, "offload", False) or wmap is None:
            continue
        key = getattr(wmap, "prefix", "") + local
        loader = getattr(wmap, "dataset", wmap)
        if key in getattr(loader, "state_dict", {}):
            return "cpu"
        if key in getattr(loader, "index", {}):
            return "disk"
    return None


def placement_table(model: nn.Module) -> pd.DataFrame:
    """Where every parameter and buffer really is, in the columns of :func:`audit_device_map`.

    A tensor that accelerate's hooks offloaded (meta in the model, values on the CPU or disk)
    shows as ``"cpu"`` or ``"disk"``; one left on the meta device otherwise gets
    ``meta-leftover`` (unless every tensor is on meta: then the model is structure only and
    nothing is flagged).

    >>> placement_table(nn.Linear(2, 2))["device"].tolist()
    ['cpu', 'cpu']
    """
    tensors = tensor_inventory(model, what="placement_table")
    rows, chains = _tensor_rows(tensors)
    modules = dict(zip(tensors.modules, tensors.module_objects, strict=True))
    device_of: list[Device | None] = []
    offloaded = False
    for r in rows:
        dev = torch_device_key(r.tensor)
        if dev == "meta":
            mod = modules[r.module]
            dev = _offloaded_device(mod, r.name[len(r.module) + 1:] if r.module else r.name) or "meta"
            offloaded |= dev != "meta"
        device_of.append(dev)
    all_meta = bool(device_of) and all(d == "meta" for d in device_of)
    devices = sorted({d for d in device_of if d is not None}, key=device_order)
    table = _audit_rows(rows, chains, device_of, devices, meta_ok=all_meta, dispatched=offloaded)
    if has_dtensors(r.tensor for r in rows):  # FSDP2 / tensor parallel: bytes per rank
        from ..sharding import with_rank_bytes
        table = with_rank_bytes(table, tensors)
    return table


def placement_findings(model: nn.Module) -> list[Finding]:
    """Findings of :func:`placement_table`, plus an info line for a structure-only model.

    >>> [f.code for f in placement_findings(nn.Linear(2, 2, device="meta"))]
    ['meta-model']
    """
    return placement_table_findings(placement_table(model))


def placement_table_findings(table: pd.DataFrame) -> list[Finding]:
    """:func:`placement_findings` of a :func:`placement_table` already made."""
    out = table_findings(table)
    if len(table) and (table["device"] == "meta").all():
        out.append(Finding("meta-model", "info", "",
                           f"all {len(table)} tensors are on the meta device: the model is structure only, "
                           "so plans and audits work but it cannot be dispatched or run"))
    return out


