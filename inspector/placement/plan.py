"""Plan a device map that places every parameter and buffer, with the reasons.

The planner fills devices in order like accelerate's ``infer_auto_device_map``, but it
never leaves a tensor out: the buffers a split module owns directly go to the device that
holds most of that module's parameter bytes, a module that holds only buffers goes with its
nearest placed neighbour, every name of a tied tensor lands on one device, and a module's own
tensors (a layer's weight and bias) stay on one device, the tied one's when there is a tie. Each step
returns records of what it decided and why, so the dashboard can show them.

Planning is arithmetic on tensor sizes: it works on the meta device and for devices this
machine does not have.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..inventory import ModuleTables, tensor_inventory
from ..utils.checks import require_module
from ..utils.findings import Finding, InspectorError
from ..utils.units import format_budget, format_bytes
from .audits import audit_table, device_usage
from .budget import Device, parse_max_memory
from .inventory import lookup, parent_name, prefixes
from .map_findings import table_findings
from .walk import Decision, Reserve, budget_records, main_devices, offloads, place_pending, walk


@dataclass(frozen=True)
class PlacementPlan:
    """A planned device map with the decisions behind it and its audit.

    ``usage`` has one row per device: ``device, parameter_bytes, buffer_bytes, total_bytes,
    budget_bytes, reserved_bytes``.
    """

    device_map: dict[str, Device]
    records: tuple[Decision, ...]
    findings: list[Finding]
    budget: dict[Device, int]
    usage: pd.DataFrame = field(repr=False)
    audit: pd.DataFrame = field(repr=False)

    def records_frame(self) -> pd.DataFrame:
        return pd.DataFrame([r.to_dict() for r in self.records],
                            columns=["step", "subject", "device", "bytes", "reason"])


PlanResult = PlacementPlan  # the earlier name, kept for existing callers



def _isolate(inv: ModuleTables, device_map: dict[str, Device], name: str) -> None:
    """Refine the map until ``name`` has its own key (same devices everywhere else)."""
    key, dev = lookup(device_map, name)
    while key != name:
        assert key is not None and dev is not None  # every tensor was placed before ties are kept
        del device_map[key]
        for part in inv.direct[key] + inv.children[key]:
            device_map[part] = dev
        key, dev = lookup(device_map, name)


def _together_groups(inv: ModuleTables) -> list[list[str]]:
    """Tensor names that must share a device: every name of one object, and the tensors one module
    owns directly, joined where they meet (a layer whose weight and bias are tied to two others)."""
    root: dict[str, str] = {}

    def find(n: str) -> str:
        while root.setdefault(n, n) != n:
            root[n] = root[root[n]]
            n = root[n]
        return n

    for names in [*inv.ties, *(names for names in inv.direct.values() if len(names) > 1)]:
        for n in names[1:]:
            root[find(n)] = find(names[0])
    groups: dict[str, list[str]] = {}
    for n in root:
        groups.setdefault(find(n), []).append(n)
    return [sorted(g, key=lambda n: inv.order.get(n, -1)) for g in groups.values() if len(g) > 1]


def _keep_together(inv: ModuleTables, device_map: dict[str, Device], devices: list[Device]) -> list[Decision]:
    """Every name of a tied tensor on one device, and a module's own tensors (a layer's weight and
    bias) on one device, as accelerate keeps a layer: ``dispatch_model`` hooks modules, not tensors,
    so a layer split across devices would mix them in its forward. The device is the first tied
    tensor's (in module order), else the one holding most of the group's bytes (earlier on equal)."""
    lead_of = {alias: names[0] for names in inv.ties for alias in names[1:]}
    leaders = {names[0] for names in inv.ties}
    rank = {d: i for i, d in enumerate(devices)}
    records = []
    for group in _together_groups(inv):
        devs: dict[str, Device] = {}
        for n in group:
            dev = lookup(device_map, n)[1]
            assert dev is not None  # every tensor was placed before this step
            devs[n] = dev
        if len(set(devs.values())) < 2:
            continue
        lead = next((n for n in group if n in leaders), None)
        if lead is not None:
            target = devs[lead]
        else:
            per: dict[Device, int] = {}
            for n, d in devs.items():
                per[d] = per.get(d, 0) + inv.sizes.get(n, 0)
            target = max(per, key=lambda d: (per[d], -rank.get(d, len(rank))))
        for n in group:
            if devs[n] == target:
                continue
            _isolate(inv, device_map, n)
            device_map[n] = target
            why = (
                f"is the same tensor as {lead_of[n]}, which is on {target}; moved from {devs[n]} so the tie "
                "holds (its bytes are counted once)"
                if n in lead_of
                else f"{parent_name(n) or 'the model'} keeps its own tensors on one device, with "
                f"{lead or 'most of their bytes'} on {target}; moved from {devs[n]}"
            )
            records.append(
                Decision("tie" if n in lead_of else "together", n, target, inv.sizes.get(n, 0), why)
            )
    return records


def clean_map(device_map: Mapping[str, Device], inv: ModuleTables) -> dict[str, Device]:
    """Merge keys into their highest ancestor whose keys all share one device; keep module order.

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    >>> inv = tensor_inventory(m).module_tables()
    >>> clean_map({"1.bias": 0, "0": 0, "1.weight": 0}, inv), clean_map({"0": 0, "1": 1}, inv)
    ({'': 0}, {'0': 0, '1': 1})
    """
    below: dict[str, set] = {}
    for key, dev in device_map.items():
        for prefix in prefixes(key)[:-1] if key else [""]:
            below.setdefault(prefix, set()).add(dev)
    out: dict[str, Device] = {}
    for key, dev in device_map.items():
        target = key
        for prefix in (prefixes(key)[:-1] if key else []):
            if len(below[prefix]) == 1:
                target = prefix
                break
        out[target] = dev
    return dict(sorted(out.items(), key=lambda kv: inv.order.get(kv[0], -1)))


def _overflow(
    inv: ModuleTables, device_map: Mapping[str, Device], capacity: dict[Device, int]
) -> dict[Device, int]:
    """Bytes over capacity per device (keys never overlap, so each tensor is counted once)."""
    used: dict[Device, int] = {}
    for key, dev in device_map.items():
        used[dev] = used.get(dev, 0) + inv.sizes[key]
    return {d: used.get(d, 0) - capacity[d] for d in capacity if used.get(d, 0) > capacity[d]}


def default_no_split(model: nn.Module, no_split_module_classes: Iterable[str] | str | None) -> list[str]:
    """The classes never to split: the argument, else the model's ``_no_split_modules``.

    >>> default_no_split(nn.Linear(2, 2), None), default_no_split(nn.Linear(2, 2), "Block")
    ([], ['Block'])
    """
    if no_split_module_classes is None:
        return list(getattr(model, "_no_split_modules", None) or [])
    if isinstance(no_split_module_classes, str):
        return [no_split_module_classes]
    return list(no_split_module_classes)


def no_split_choices(model: nn.Module) -> tuple[list[str], list[str]]:
    """The module classes of ``model`` (sorted) and those of its ``_no_split_modules`` among them.

    >>> no_split_choices(nn.Sequential(nn.Linear(2, 2)))
    (['Linear', 'Sequential'], [])
    """
    classes = sorted({type(m).__name__ for m in model.modules()})
    return classes, [c for c in default_no_split(model, None) if c in classes]


@dataclass(frozen=True)
class _Plan:
    device_map: dict[str, Device]
    records: list[Decision]
    inv: ModuleTables
    budget: dict[Device, int]
    reserve: dict[Device, int]
    split: list[str]
    no_split: set[str]


def plan_steps(model: nn.Module, max_memory: str | Mapping[Any, Any],
          no_split_module_classes: Iterable[str] | str | None,
          dtype: torch.dtype | str | None) -> _Plan:
    """The planning steps in order; a rerun reserves room that buffers placed late overfilled."""
    budget = parse_max_memory(max_memory)
    no_split = set(default_no_split(model, no_split_module_classes))
    inv = tensor_inventory(model).module_tables(dtype)
    devices = list(budget)
    main = main_devices(budget)
    extra: dict[Device, int] = {d: 0 for d in devices}
    extra_records: list[Decision] = []
    reserve: Reserve | None = None  # room to load back layers is kept only when something is offloaded
    for _attempt in range(len(devices) + 4):
        capacity = {d: max(0, budget[d] - extra[d]) for d in devices}
        state = walk(inv, budget, capacity, no_split, reserve)
        pending = place_pending(inv, state, devices)
        device_map = dict(state.assigned)
        ties = _keep_together(inv, device_map, devices)
        if reserve is None and main and offloads(device_map, budget):
            reserve = Reserve(inv, no_split, main)
            extra = {d: 0 for d in devices}  # room found for buffers without a reserve does not carry over
            extra_records = []
            continue
        over = _overflow(inv, device_map, {d: budget[d] for d in devices})
        if not over:
            break
        for d, n in over.items():
            extra[d] += n
            extra_records.append(
                Decision(
                    "reserve",
                    "",
                    d,
                    n,
                    f"tensors placed after the walk (buffers, ties, layers kept whole) overfilled {d} by "
                    f"{format_bytes(n)}; "
                    "kept that much free and planned again",
                )
            )
    else:
        raise InspectorError(f"could not fit the buffers of split modules into the budget "
                             f"({format_budget(budget)}); raise a budget or add disk=...")
    kept = {} if reserve is None else reserve.kept
    reserve_records = [
        Decision(
            "reserve",
            name,
            d,
            size,
            f"kept {format_bytes(size)} free on {d} to load back the largest layer still to "
            f"place ({name or 'model'}) when it runs from an offload device",
        )
        for d, (size, name) in kept.items()
        if size
    ]
    reserved = {d: kept.get(d, (0, ""))[0] for d in devices}
    cleaned = clean_map(device_map, inv)
    records = (budget_records(budget) + reserve_records + extra_records + state.records + pending + ties
               + [Decision("clean", "", None, 0, f"merged {len(device_map)} keys into {len(cleaned)} "
                           "where a whole module sits on one device")])
    return _Plan(cleaned, records, inv, budget, reserved, state.split, no_split)


def plan_device_map_explained(model: nn.Module, max_memory: str | Mapping[Any, Any],
                              no_split_module_classes: Iterable[str] | str | None = None,
                              dtype: torch.dtype | str | None = None) -> PlacementPlan:
    """Plan a device map and say why: :func:`plan_device_map` plus records, usage and audit.

    >>> m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))  # 80 bytes each
    >>> plan = plan_device_map_explained(m, "0=100,1=100")
    >>> plan.device_map, [r.step for r in plan.records][-2:]
    ({'0': 0, '1': 1}, ['place', 'clean'])
    """
    model = require_module(model, "plan_device_map_explained")
    return explain(model, plan_steps(model, max_memory, no_split_module_classes, dtype))


def explain(model: nn.Module, p: _Plan) -> PlacementPlan:
    table = audit_table(p.inv.inventory, p.device_map)
    usage = device_usage(table, p.budget, p.reserve)
    findings = table_findings(table) + _split_notes(p.inv, p.split, p.device_map)
    return PlacementPlan(p.device_map, tuple(p.records), findings, p.budget, usage, table)


def _split_notes(inv: ModuleTables, split: list[str], device_map: Mapping[str, Device]) -> list[Finding]:
    """Info: a split module that owns tensors directly may mix devices in its own forward."""
    out = []
    for m in split:
        if not m or not inv.direct.get(m):
            continue
        devs = {lookup(device_map, n)[1] for n in inv.direct[m]}
        devs |= {lookup(device_map, c)[1] for c in inv.children[m] if c in device_map}
        if len(devs) > 1:
            out.append(Finding("split-owner", "info", m,
                               f"{m} ({inv.classes[m]}) is split across {sorted(map(str, devs))} and uses "
                               "its own tensors in forward; if the forward pass mixes devices, add "
                               f"{inv.classes[m]!r} to no_split_module_classes"))
    return out


def plan_device_map(model: nn.Module, max_memory: str | Mapping[Any, Any],
                    no_split_module_classes: Iterable[str] | str | None = None,
                    dtype: torch.dtype | str | None = None) -> dict[str, Device]:
    """A device map in accelerate's format that places every parameter and buffer.

    Devices are filled in order (GPUs by index, then mps, cpu, disk); a module that does not
    fit is split into its parameters and children unless its class is in
    ``no_split_module_classes`` (default: the model's ``_no_split_modules``). The buffers a
    split module owns directly go to the device holding most of its parameter bytes (the
    earlier device on a tie); a module with buffers and no parameters goes with its nearest
    placed neighbour; every name of a tied tensor lands on one device, and the tensors a module
    owns directly (a layer's weight and bias) stay together. When an offload device
    follows, the first GPU (and the CPU before disk) keeps the largest layer free, as
    accelerate does. The map passes ``accelerate.utils.check_device_map`` and can be handed to
    ``accelerate.dispatch_model``. See :func:`plan_device_map_explained` for the reasons.

    Args:
        model: any module, also on the meta device; it is not changed.
        max_memory: ``"0=20GiB,1=20GiB,cpu=200GiB"`` or a mapping device -> bytes or size string.
        no_split_module_classes: class names never to split.
        dtype: size floating tensors as if cast to this dtype.

    Raises:
        InspectorError: (a ValueError) unknown devices, unreadable sizes, or a budget too small
            for the model with nowhere to offload (it says how many bytes are needed and given).

    >>> m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))  # 80 bytes each
    >>> m[1].weight = m[0].weight  # tied: 80 + 16 bytes in all
    >>> # "1" does not fit after "0", and cannot leave its weight: all on 1
    >>> plan_device_map(m, {0: 90, 1: 1000})
    {'': 1}
    """
    model = require_module(model, "plan_device_map")
    return plan_steps(model, max_memory, no_split_module_classes, dtype).device_map


# ----------------------------------------------------------------------------- audit
