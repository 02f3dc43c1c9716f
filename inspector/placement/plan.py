"""Device maps: plan one that places every parameter and buffer, audit any map, dispatch.

A device map (accelerate's format) sends module or tensor names to devices: GPU indices
(``0``, ``1``...), ``"mps"``, ``"cpu"`` or ``"disk"``. The planner fills devices in that
order like accelerate's ``infer_auto_device_map``, but it never leaves a tensor out: the
buffers a split module owns directly go to the device that holds most of that module's
parameter bytes, a module that holds only buffers goes with its nearest placed neighbour,
and every name of a tied tensor lands on one device. Each step returns records of what it
decided and why, so the dashboard can show them.

Planning is arithmetic on tensor sizes: it works on the meta device and for devices this
machine does not have.
"""

from __future__ import annotations

import copy
import json
import math
import re
import tempfile
import time
import warnings
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import pandas as pd
import torch
from torch import nn

from .checks import require_module
from .distributed.tensors import has_dtensors
from .findings import Finding, InspectorError
from .locks import model_lock

Device = int | str  # GPU index, "mps", "cpu" or "disk"

DEVICE_KINDS = ("mps", "cpu", "disk")
AUDIT_COLUMNS = ["name", "kind", "module", "device", "module_primary_device", "split", "finding",
                 "bytes", "alias_of"]
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")
_SEVERITY = {"param-unplaced": "error", "buffer-unplaced": "error", "tie-split": "error",
             "meta-leftover": "error", "buffer-stranded": "warning", "unknown-key": "error",
             "overlapping-key": "warning"}
_MAX_FINDINGS_PER_CODE = 20


# ----------------------------------------------------------------------------- devices, budgets

def normalise_device(value: Any) -> Device:
    """A device in accelerate's map format: GPU index, ``"mps"``, ``"cpu"`` or ``"disk"``.

    Accepts ints, digit strings, ``"cuda"``/``"cuda:N"``, ``"mps"``, ``"cpu"``, ``"disk"`` and
    ``torch.device``; anything else is an InspectorError.

    >>> normalise_device("cuda:1"), normalise_device("0"), normalise_device("CPU")
    (1, 0, 'cpu')
    """
    if isinstance(value, bool):
        raise InspectorError(f"unknown device {value!r}: use a GPU index, 'mps', 'cpu' or 'disk'")
    if isinstance(value, int):
        if value < 0:
            raise InspectorError(f"GPU index {value} is negative; GPU indices start at 0")
        return value
    if isinstance(value, torch.device):
        value = str(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text.isdigit():
            return int(text)
        if text in DEVICE_KINDS:
            return text
        if text == "mps:0":
            return "mps"
        if text == "cuda":
            return 0
        match = re.fullmatch(r"cuda:(\d+)", text)
        if match:
            return int(match.group(1))
    raise InspectorError(f"unknown device {value!r}: use a GPU index such as 0 or 'cuda:0', "
                         "or 'mps', 'cpu' or 'disk'")


def device_order(device: Device) -> tuple[int, int]:
    """Sort key: GPUs by index, then mps, cpu, disk (the order devices are filled).

    >>> sorted(["disk", "cpu", 1, "mps", 0], key=device_order)
    [0, 1, 'mps', 'cpu', 'disk']
    """
    if isinstance(device, int):
        return (0, device)
    return (1, DEVICE_KINDS.index(device)) if device in DEVICE_KINDS else (2, 0)


def parse_size(value: int | float | str, what: str = "size") -> int:
    """Bytes from ``1024``, ``"20GiB"``, ``"1.5 GB"`` or ``"300MB"`` (GB = 10**9, GiB = 2**30).

    >>> parse_size("20GiB"), parse_size("1.5KB"), parse_size(7)
    (21474836480, 1500, 7)
    """
    if isinstance(value, bool):
        raise InspectorError(f"{what}: {value!r} is not a size")
    if isinstance(value, (int, float)):
        number, unit = float(value), ""
    else:
        match = _SIZE.match(str(value))
        if not match or match.group(2).upper() not in _UNITS:
            raise InspectorError(f"{what}: cannot read {value!r} as a size; write bytes or a number "
                                 "with a unit such as 20GiB, 500MB or 4096")
        number, unit = float(match.group(1)), match.group(2).upper()
    if not math.isfinite(number):
        raise InspectorError(f"{what}: {value!r} is not a finite number of bytes; write bytes or a "
                             "number with a unit such as 20GiB, 500MB or 4096")
    if number < 0:
        raise InspectorError(f"{what}: {value!r} is negative")
    return int(number * _UNITS[unit])


def parse_max_memory(text: str | Mapping[Any, Any]) -> dict[Device, int]:
    """A budget per device, in bytes, ordered GPUs first, then mps, cpu, disk.

    Args:
        text: ``"0=20GiB,1=20GiB,cpu=200GiB"`` or a mapping such as ``{0: "20GiB", "cpu": 10**9}``.

    Raises:
        InspectorError: unknown device names, repeated devices, unreadable sizes, an empty budget.

    >>> parse_max_memory("1=2KiB, 0=1KiB, cpu=1MB")
    {0: 1024, 1: 2048, 'cpu': 1000000}
    """
    if isinstance(text, Mapping):
        items = list(text.items())
    else:
        items = []
        for part in str(text).split(","):
            if not part.strip():
                continue
            if "=" not in part and ":" not in part.replace("cuda:", ""):
                raise InspectorError(f"budget entry {part.strip()!r} has no '=': write DEVICE=SIZE, "
                                     "e.g. 0=20GiB,cpu=200GiB")
            key, _, size = part.partition("=") if "=" in part else part.rpartition(":")
            items.append((key.strip(), size.strip()))
    budget: dict[Device, int] = {}
    for key, size in items:
        dev = normalise_device(key)
        if dev in budget:
            raise InspectorError(f"device {dev!r} appears twice in the budget")
        budget[dev] = parse_size(size, f"budget for device {dev!r}")
    if not budget:
        raise InspectorError("the budget is empty: give at least one device, e.g. cpu=16GiB")
    return {d: budget[d] for d in sorted(budget, key=device_order)}


def format_max_memory(budget: Mapping[Device, int]) -> str:
    """The inverse of :func:`parse_max_memory` (exact bytes, or whole GiB/MiB where exact).

    >>> format_max_memory({0: 2**31, "cpu": 1000})
    '0=2GiB,cpu=1000'
    """
    def size(n: int) -> str:
        for unit, mult in (("GiB", 2**30), ("MiB", 2**20)):
            if n and n % mult == 0:
                return f"{n // mult}{unit}"
        return str(n)
    return ",".join(f"{d}={size(int(n))}" for d, n in budget.items())


def _torch_device_key(t: torch.Tensor) -> Device:
    kind = t.device.type
    if kind == "cuda":
        return t.device.index or 0
    return kind


# ----------------------------------------------------------------------------- inventory

class TensorInfo(NamedTuple):
    """One name of a parameter or buffer; ``leader`` is the first name of the same object."""

    name: str
    kind: str          # "parameter" | "buffer"
    module: str
    nbytes: int
    leader: str
    persistent: bool = True


@dataclass(frozen=True)
class Inventory:
    """Every tensor name and module of a model, with bytes by module prefix (one pass)."""

    tensors: tuple[TensorInfo, ...]
    by_name: dict[str, TensorInfo]
    sizes: dict[str, int]             # module or tensor name -> bytes of unique tensors under it
    param_sizes: dict[str, int]       # module or tensor name -> bytes of unique parameters under it
    children: dict[str, list[str]]    # module -> child module names (full)
    direct: dict[str, list[str]]      # module -> its own tensor names (parameters, then buffers)
    classes: dict[str, str]           # module -> class name
    order: dict[str, int]             # every module and tensor name -> position in module order
    parent: dict[str, str]            # module -> its parent module ("" for the root's children)
    ties: tuple[tuple[str, ...], ...]  # names of one object, leader first (two or more)
    param_owners: frozenset[str]       # modules with at least one parameter name under them

    def has_params(self, module: str) -> bool:
        return module in self.param_owners


def _prefixes(module: str) -> list[str]:
    """'a.b' -> ['', 'a', 'a.b']."""
    if not module:
        return [""]
    parts = module.split(".")
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


def _byte_size(t: torch.Tensor, dtype_size: int | None) -> int:
    size = t.element_size()
    if dtype_size is not None and (t.is_floating_point() or t.is_complex()):
        size = min(size, dtype_size)
    return t.numel() * size


def _sum_up(modules: list[str], parent: dict[str, str], sizes: dict[str, int], psizes: dict[str, int],
            has_param: dict[str, bool]) -> None:
    """Add each module's totals into its parent, deepest first (``modules`` is in pre-order)."""
    for mname in reversed(modules):
        if mname:
            up = parent[mname]
            sizes[up] += sizes[mname]
            psizes[up] += psizes[mname]
            has_param[up] |= has_param[mname]


def inventory(model: nn.Module, dtype: torch.dtype | str | None = None) -> Inventory:
    """Every parameter and buffer name (aliases too) and bytes by prefix, in one pass.

    Bytes count each tensor object once, under its first name (as ``named_parameters()``
    and accelerate's ``compute_module_sizes`` do). With ``dtype``, floating tensors are sized
    as if cast to it (never larger than they are); integer and bool tensors keep their size.
    Module sizes are summed bottom-up over the modules, not per tensor and prefix.

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))  # 24 + 16 bytes; buffers 16 + 8
    >>> inventory(m).sizes[""], inventory(m).sizes["1"], inventory(m).param_sizes[""]
    (64, 40, 40)
    """
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            raise InspectorError("unknown dtype for sizing; use e.g. float16, bfloat16 or float32")
    dtype = None if dtype is None else torch.empty((), dtype=dtype, device="meta").element_size()
    tensors: list[TensorInfo] = []
    children: dict[str, list[str]] = {}
    direct: dict[str, list[str]] = {}
    classes: dict[str, str] = {}
    order: dict[str, int] = {}
    parent: dict[str, str] = {}
    sizes: dict[str, int] = {}
    psizes: dict[str, int] = {}
    has_param: dict[str, bool] = {}
    first: dict[int, str] = {}
    groups: dict[str, list[str]] = {}
    # Pre-order over every path (like named_modules(remove_duplicate=False)); a tensor's leader is
    # its first name in this order, which is the name named_parameters()/named_buffers() keep.
    # The model holds every tensor for the whole pass, so ids are not reused while grouping.
    stack: list[tuple[str, nn.Module]] = [("", model)]
    while stack:
        mname, mod = stack.pop()
        classes[mname] = type(mod).__name__
        order[mname] = len(order)
        prefix = f"{mname}." if mname else ""
        kids = children[mname] = []
        for c, sub in mod._modules.items():
            if sub is not None:
                kids.append(prefix + c)
                parent[prefix + c] = mname
        stack.extend(zip(reversed(kids), [m for m in reversed(mod._modules.values()) if m is not None]))
        own = direct[mname] = []
        total = ptotal = 0
        owns_param = False
        for kind, store in (("parameter", mod._parameters), ("buffer", mod._buffers)):
            for local, t in store.items():
                if t is None:
                    continue
                full = prefix + local
                own.append(full)
                order[full] = len(order)
                leader = first.setdefault(id(t), full)
                nbytes = _byte_size(t, dtype)
                is_param = kind == "parameter"
                tensors.append(TensorInfo(full, kind, mname, nbytes, leader,
                                          is_param or local not in mod._non_persistent_buffers_set))
                if leader == full:
                    sizes[full] = nbytes
                    total += nbytes
                    psizes[full] = nbytes if is_param else 0
                    ptotal += nbytes if is_param else 0
                else:
                    sizes[full] = psizes[full] = 0
                    groups.setdefault(leader, [leader]).append(full)
                owns_param |= is_param
        sizes[mname], psizes[mname], has_param[mname] = total, ptotal, owns_param
    _sum_up(list(classes), parent, sizes, psizes, has_param)
    return Inventory(tuple(tensors), {t.name: t for t in tensors}, sizes, psizes, children, direct,
                     classes, order, parent, tuple(tuple(g) for g in groups.values()),
                     frozenset(m for m, v in has_param.items() if v))


# ----------------------------------------------------------------------------- records, results

@dataclass(frozen=True)
class Decision:
    """One thing the planner decided, and why."""

    step: str           # "budget", "reserve", "place", "split", "next-device", "buffer", "tie", "clean"
    subject: str        # module or tensor name ("" for the whole model or a device-level step)
    device: Device | None
    nbytes: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "subject": self.subject, "device": self.device,
                "bytes": self.nbytes, "reason": self.reason}


@dataclass(frozen=True)
class PlanResult:
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


@dataclass(frozen=True)
class DeviceMapAudit:
    """One row per parameter and buffer name (``table``), plus findings about the map's keys."""

    table: pd.DataFrame
    findings: list[Finding]


# ----------------------------------------------------------------------------- planning steps

@dataclass
class _WalkState:
    assigned: dict[str, Device]
    used: dict[Device, int]
    split: list[str]
    pending: list[tuple[str, str]]  # (name, owner module) of buffers and buffer-only modules
    records: list[Decision]


def _budget_records(budget: dict[Device, int]) -> list[Decision]:
    return [Decision("budget", "", d, n, f"device {d} may hold {n} bytes") for d, n in budget.items()]


def _largest_layer(inv: Inventory, no_split: set[str]) -> tuple[str, int]:
    """The biggest unit that can never be split: a leaf module or a no-split class."""
    best, best_size = "", 0
    stack = [""]
    while stack:
        name = stack.pop()
        kids = inv.children[name]
        if not kids or inv.classes[name] in no_split:
            if inv.sizes[name] > best_size:
                best, best_size = name, inv.sizes[name]
            continue
        stack.extend(reversed(kids))
    return best, best_size


def _main_devices(budget: dict[Device, int]) -> list[Device]:
    """Devices that load back offloaded layers: the first GPU when cpu or disk follows, and the
    cpu when disk follows."""
    devices = list(budget)
    gpus = [d for d in devices if d not in ("cpu", "disk")]
    main: list[Device] = []
    if gpus and ("cpu" in devices or "disk" in devices):
        main.append(gpus[0])
    if "cpu" in devices and "disk" in devices:
        main.append("cpu")
    return main


def _offloads(device_map: Mapping[str, Device], budget: dict[Device, int]) -> bool:
    """Whether anything lands on a device whose layers run elsewhere (cpu after a GPU, disk)."""
    offload = _offload_devices(main_device(budget))
    return any(d in offload for d in device_map.values())


class _Reserve:
    """Room kept free on a main device: the largest layer still to place (accelerate's rule).

    ``largest[unit]`` is the biggest leaf or no-split module inside ``unit`` (0 for a tensor).
    """

    def __init__(self, inv: Inventory, no_split: set[str], main: list[Device]) -> None:
        self.inv, self.no_split, self.main = inv, no_split, set(main)
        self.largest: dict[str, tuple[int, str]] = {}
        self.kept: dict[Device, tuple[int, str]] = {}

    def within(self, unit: str) -> tuple[int, str]:
        got = self.largest.get(unit)
        if got is None:
            kids = self.inv.children.get(unit)
            if kids is None:
                got = (0, "")
            elif not kids or self.inv.classes[unit] in self.no_split:
                got = (self.inv.sizes[unit], unit)
            else:
                got = max((self.within(k) for k in kids), default=(0, ""))
            self.largest[unit] = got
        return got

    def on(self, dev: Device, queue: Iterable[str]) -> int:
        if dev not in self.main:
            return 0
        size, name = max((self.within(u) for u in queue), default=(0, ""))
        self.kept[dev] = (size, name)
        return size


def _splittable(inv: Inventory, name: str, no_split: set[str]) -> bool:
    return name in inv.children and bool(inv.children[name]) and inv.classes[name] not in no_split


def _units_of(inv: Inventory, module: str, state: _WalkState) -> list[str]:
    """What a split module becomes: its own parameters and its children, in order.

    Its own buffers, and children that hold buffers but no parameters, wait until the
    devices of its parameters are known (see :func:`_place_pending`).
    """
    units = [n for n in inv.direct[module] if inv.by_name[n].kind == "parameter"]
    for n in inv.direct[module]:
        if inv.by_name[n].kind == "buffer":
            state.pending.append((n, module))
    for child in inv.children[module]:
        if inv.sizes[child] > 0 and not inv.has_params(child):
            state.pending.append((child, module))
        else:
            units.append(child)
    return units


def _walk(inv: Inventory, budget: dict[Device, int], capacity: dict[Device, int],
          no_split: set[str], reserve: _Reserve | None = None) -> _WalkState:
    """Fill devices in order; split what does not fit; move on when nothing more fits.

    With ``reserve``, a main device keeps the largest layer still to place free (the unit
    being placed does not count: it is not loaded back while it sits there).
    """
    devices = list(budget)
    state = _WalkState({}, {d: 0 for d in devices}, [""], [], [])
    queue = deque(_units_of(inv, "", state))
    i = 0
    while queue:
        unit = queue.popleft()
        size = inv.sizes[unit]
        dev = devices[i]
        keep = reserve.on(dev, queue) if reserve is not None else 0
        if state.used[dev] + size <= capacity[dev] - keep:
            state.assigned[unit] = dev
            state.used[dev] += size
            state.records.append(Decision("place", unit, dev, size,
                                          f"fits: {state.used[dev]} of {capacity[dev]} bytes used on {dev}"))
        elif _splittable(inv, unit, no_split):
            state.split.append(unit)
            parts = _units_of(inv, unit, state)
            queue.extendleft(reversed(parts))
            state.records.append(Decision("split", unit, dev, size,
                                          f"{size} bytes do not fit the {capacity[dev] - keep - state.used[dev]} "
                                          f"left on {dev}; placing its {len(parts)} parts one by one"))
        elif i + 1 < len(devices):
            why = "cannot be split" if unit not in inv.children or not inv.children[unit] else \
                f"is a {inv.classes[unit]} (no-split)"
            state.records.append(Decision("next-device", unit, devices[i + 1], size,
                                          f"{size} bytes do not fit the {capacity[dev] - keep - state.used[dev]} "
                                          f"left on {dev} and it {why}"))
            i += 1
            queue.appendleft(unit)
        else:
            _raise_no_room(inv, budget, capacity, unit, state)
    return state


def _raise_no_room(inv: Inventory, budget: dict[Device, int], capacity: dict[Device, int],
                   unit: str, state: _WalkState) -> None:
    need, have = inv.sizes[""], sum(budget.values())
    hint = "" if "disk" in budget else "; add disk=... to offload to disk"
    raise InspectorError(
        f"the budget is too small: the model needs {need} bytes and the budget gives {have} bytes "
        f"({format_max_memory(budget)}). {unit or 'the model'} ({inv.sizes[unit]} bytes) does not fit "
        f"on the last device {list(budget)[-1]!r} ({capacity[list(budget)[-1]] - state.used[list(budget)[-1]]} "
        f"bytes left there){hint} or raise a budget.")


def _lookup(device_map: Mapping[str, Device], name: str) -> tuple[str | None, Device | None]:
    """The map key covering ``name`` (the longest prefix) and its device."""
    probe = name
    while True:
        if probe in device_map:
            return probe, device_map[probe]
        if not probe:
            return None, None
        probe = _parent(probe)


def _primary_device(inv: Inventory, device_map: Mapping[str, Device], module: str,
                    devices: list[Device]) -> Device | None:
    """The device holding most of a module's parameter bytes (the earlier device on a tie)."""
    key, dev = _lookup(device_map, module)
    if key is not None:
        return dev
    per: dict[Device, int] = {}
    prefix = f"{module}." if module else ""
    for k, d in device_map.items():
        if k.startswith(prefix):
            per[d] = per.get(d, 0) + inv.param_sizes.get(k, 0)
    per = {d: n for d, n in per.items() if n}
    if not per:
        return None
    rank = {d: i for i, d in enumerate(devices)}
    return max(per, key=lambda d: (per[d], -rank.get(d, len(rank))))


def _neighbour_device(inv: Inventory, module: str, owner: str, device_map: Mapping[str, Device],
                      devices: list[Device]) -> tuple[Device | None, str]:
    """Device of the nearest sibling that holds parameters (earlier one first on equal distance)."""
    siblings = inv.children[owner]
    i = siblings.index(module)
    for dist in range(1, len(siblings)):
        for j in (i - dist, i + dist):
            if 0 <= j < len(siblings) and inv.has_params(siblings[j]):
                dev = _primary_device(inv, device_map, siblings[j], devices)
                if dev is not None:
                    return dev, siblings[j]
    return _primary_device(inv, device_map, owner, devices), owner


def _place_pending(inv: Inventory, state: _WalkState, devices: list[Device]) -> list[Decision]:
    """Own buffers of split modules -> the module's primary device; buffer-only modules -> neighbour."""
    records = []
    placed = dict(state.assigned)  # decide from the walk alone, so the order of pending does not matter
    primary: dict[str, Device | None] = {}
    for name, owner in state.pending:
        size = inv.sizes[name]
        if name in inv.by_name:  # a buffer the split module owns directly
            if owner not in primary:
                primary[owner] = _primary_device(inv, placed, owner, devices)
            dev = primary[owner] if primary[owner] is not None else devices[0]
            reason = (f"{owner or 'the model'} is split; its own buffer goes to its primary device {dev}, "
                      "which holds most of its parameter bytes")

        else:
            dev, near = _neighbour_device(inv, name, owner, placed, devices)
            dev = devices[0] if dev is None else dev
            reason = f"holds buffers but no parameters; goes with its nearest placed neighbour {near or 'model'}"
        state.assigned[name] = dev
        state.used[dev] += size
        records.append(Decision("buffer", name, dev, size, reason))
    return records


def main_device(devices: Iterable[Any]) -> Device:
    """Where offloaded layers run: the first GPU, else mps, else cpu (as ``dispatch_model`` does).

    >>> main_device(["cpu", 1, "disk", 0]), main_device(["cpu", "disk"])
    (0, 'cpu')
    """
    devs = [d for d in devices if d is not None]
    gpus = sorted(d for d in devs if isinstance(d, int))
    return gpus[0] if gpus else "mps" if "mps" in devs else "cpu"


def _offload_devices(main: Device) -> set[Device]:
    """Devices whose tensors run on ``main``: disk, and cpu too when a GPU leads."""
    return {"disk"} if main in ("cpu", "mps") else {"cpu", "disk"}


def _isolate(inv: Inventory, device_map: dict[str, Device], name: str) -> None:
    """Refine the map until ``name`` has its own key (same devices everywhere else)."""
    key, dev = _lookup(device_map, name)
    while key != name:
        del device_map[key]
        for part in inv.direct[key] + inv.children[key]:
            device_map[part] = dev
        key, dev = _lookup(device_map, name)


def _keep_ties(inv: Inventory, device_map: dict[str, Device]) -> list[Decision]:
    """Every name of one tensor object goes to the device of its first name."""
    records = []
    for names in inv.ties:
        _, lead_dev = _lookup(device_map, names[0])
        for alias in names[1:]:
            _, dev = _lookup(device_map, alias)
            if dev != lead_dev:
                _isolate(inv, device_map, alias)
                device_map[alias] = lead_dev
                records.append(Decision("tie", alias, lead_dev, 0,
                                        f"is the same tensor as {names[0]}, which is on {lead_dev}; "
                                        f"moved from {dev} so the tie holds (its bytes are counted once)"))
    return records


def clean_map(device_map: Mapping[str, Device], inv: Inventory) -> dict[str, Device]:
    """Merge keys into their highest ancestor whose keys all share one device; keep module order.

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
    >>> clean_map({"1.bias": 0, "0": 0, "1.weight": 0}, inventory(m)), clean_map({"0": 0, "1": 1}, inventory(m))
    ({'': 0}, {'0': 0, '1': 1})
    """
    below: dict[str, set] = {}
    for key, dev in device_map.items():
        for prefix in _prefixes(key)[:-1] if key else [""]:
            below.setdefault(prefix, set()).add(dev)
    out: dict[str, Device] = {}
    for key, dev in device_map.items():
        target = key
        for prefix in (_prefixes(key)[:-1] if key else []):
            if len(below[prefix]) == 1:
                target = prefix
                break
        out[target] = dev
    return dict(sorted(out.items(), key=lambda kv: inv.order.get(kv[0], -1)))


def _overflow(inv: Inventory, device_map: Mapping[str, Device], capacity: dict[Device, int]) -> dict[Device, int]:
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


@dataclass(frozen=True)
class _Plan:
    device_map: dict[str, Device]
    records: list[Decision]
    inv: Inventory
    budget: dict[Device, int]
    reserve: dict[Device, int]
    split: list[str]
    no_split: set[str]


def _plan(model: nn.Module, max_memory: str | Mapping[Any, Any],
          no_split_module_classes: Iterable[str] | str | None,
          dtype: torch.dtype | str | None) -> _Plan:
    """The planning steps in order; a rerun reserves room that buffers placed late overfilled."""
    budget = parse_max_memory(max_memory)
    no_split = set(default_no_split(model, no_split_module_classes))
    inv = inventory(model, dtype)
    devices = list(budget)
    main = _main_devices(budget)
    extra: dict[Device, int] = {d: 0 for d in devices}
    extra_records: list[Decision] = []
    reserve: _Reserve | None = None  # room to load back layers is kept only when something is offloaded
    for _attempt in range(len(devices) + 4):
        capacity = {d: max(0, budget[d] - extra[d]) for d in devices}
        state = _walk(inv, budget, capacity, no_split, reserve)
        pending = _place_pending(inv, state, devices)
        device_map = dict(state.assigned)
        ties = _keep_ties(inv, device_map)
        if reserve is None and main and _offloads(device_map, budget):
            reserve = _Reserve(inv, no_split, main)
            extra = {d: 0 for d in devices}  # room found for buffers without a reserve does not carry over
            extra_records = []
            continue
        over = _overflow(inv, device_map, {d: budget[d] for d in devices})
        if not over:
            break
        for d, n in over.items():
            extra[d] += n
            extra_records.append(Decision("reserve", "", d, n,
                                          f"buffers placed after the walk overfilled {d} by {n} bytes; "
                                          "kept that much free and planned again"))
    else:
        raise InspectorError(f"could not fit the buffers of split modules into the budget "
                             f"({format_max_memory(budget)}); raise a budget or add disk=...")
    kept = {} if reserve is None else reserve.kept
    reserve_records = [Decision("reserve", name, d, size,
                                f"kept {size} bytes free on {d} to load back the largest layer still to "
                                f"place ({name or 'model'}) when it runs from an offload device")
                       for d, (size, name) in kept.items() if size]
    reserved = {d: kept.get(d, (0, ""))[0] for d in devices}
    cleaned = clean_map(device_map, inv)
    records = (_budget_records(budget) + reserve_records + extra_records + state.records + pending + ties
               + [Decision("clean", "", None, 0, f"merged {len(device_map)} keys into {len(cleaned)} "
                           "where a whole module sits on one device")])
    return _Plan(cleaned, records, inv, budget, reserved, state.split, no_split)


def plan_device_map_explained(model: nn.Module, max_memory: str | Mapping[Any, Any],
                              no_split_module_classes: Iterable[str] | str | None = None,
                              dtype: torch.dtype | str | None = None) -> PlanResult:
    """Plan a device map and say why: :func:`plan_device_map` plus records, usage and audit.

    >>> m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))  # 80 bytes each
    >>> plan = plan_device_map_explained(m, "0=100,1=100")
    >>> plan.device_map, [r.step for r in plan.records][-2:]
    ({'0': 0, '1': 1}, ['place', 'clean'])
    """
    model = require_module(model, "plan_device_map_explained")
    return _explain(model, _plan(model, max_memory, no_split_module_classes, dtype))


def _explain(model: nn.Module, p: _Plan) -> PlanResult:
    table = audit_device_map(model, p.device_map)
    usage = device_usage(table, p.budget, p.reserve)
    findings = _table_findings(table) + _split_notes(p.inv, p.split, p.device_map)
    return PlanResult(p.device_map, tuple(p.records), findings, p.budget, usage, table)


def _split_notes(inv: Inventory, split: list[str], device_map: Mapping[str, Device]) -> list[Finding]:
    """Info: a split module that owns tensors directly may mix devices in its own forward."""
    out = []
    for m in split:
        if not m or not inv.direct.get(m):
            continue
        devs = {_lookup(device_map, n)[1] for n in inv.direct[m]}
        devs |= {_lookup(device_map, c)[1] for c in inv.children[m] if c in device_map}
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
    placed neighbour; every name of a tied tensor lands on one device. When an offload device
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
    >>> plan_device_map(m, {0: 90, 1: 1000})  # "1" does not fit on 0; its tied weight stays there
    {'0': 0, '1.weight': 0, '1.bias': 1}
    """
    model = require_module(model, "plan_device_map")
    return _plan(model, max_memory, no_split_module_classes, dtype).device_map


# ----------------------------------------------------------------------------- audit

def normalise_map(device_map: Mapping[str, Any]) -> dict[str, Device]:
    """Keys as strings, devices in accelerate's format; bad devices raise InspectorError."""
    if not isinstance(device_map, Mapping):
        raise InspectorError(f"a device map is a mapping of names to devices, not {type(device_map).__name__}")
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
        raise InspectorError(f"{source} is not valid JSON: {exc.msg} at line {exc.lineno}, "
                             f"column {exc.colno}; write it like {{\"embed\": 0, \"head\": \"cpu\"}}") from None
    if not isinstance(data, dict):
        raise InspectorError(f"{source} must be a JSON object of names to devices, not {type(data).__name__}")
    return normalise_map(data)


def _key_findings(names: set[str], device_map: Mapping[str, Device]) -> list[Finding]:
    """unknown-key and overlapping-key findings; ``names`` holds every module and tensor name."""
    findings = []
    for key in device_map:
        if key and key not in names:
            findings.append(Finding("unknown-key", "error", key,
                                    f"device map key {key!r} names no module, parameter or buffer of the "
                                    "model; fix its spelling or remove it"))
        parent = key
        while parent:
            parent = _parent(parent)
            if parent in device_map:
                findings.append(Finding("overlapping-key", "warning", key,
                                        f"device map keys {parent!r} and {key!r} overlap: {key} says "
                                        f"{device_map[key]} inside {parent or 'the model'} on {device_map[parent]}; "
                                        "keep one of them"))
                break
    return findings


class _Row(NamedTuple):
    name: str
    kind: str
    module: str
    nbytes: int
    leader: str
    owners: tuple[str, ...]  # modules above (and including) this one that own tensors directly
    tensor: torch.Tensor


def _tensor_rows(model: nn.Module) -> tuple[list[_Row], list[str]]:
    """Every parameter and buffer name in module order, and every module name (one pass)."""
    rows: list[_Row] = []
    modules: list[str] = []
    first: dict[int, str] = {}
    stack: list[tuple[str, nn.Module, tuple[str, ...]]] = [("", model, ())]
    while stack:
        mname, mod, chain = stack.pop()
        modules.append(mname)
        prefix = f"{mname}." if mname else ""
        params, buffers = mod._parameters, mod._buffers
        if params or buffers:
            chain = chain + (mname,)
        stack.extend(reversed([(prefix + c, m, chain) for c, m in mod._modules.items() if m is not None]))
        for kind, store in (("parameter", params), ("buffer", buffers)):
            for local, t in store.items():
                if t is not None:
                    full = prefix + local
                    rows.append(_Row(full, kind, mname, t.numel() * t.element_size(),
                                     first.setdefault(id(t), full), chain, t))
    return rows, modules


def _audit_rows(rows: list[_Row], device_of: list[Device | None], devices: list[Device],
                meta_ok: bool = False, dispatched: bool = False) -> pd.DataFrame:
    """The audit table, given each row's device (None: unassigned).

    With ``dispatched`` (real placement after accelerate's hooks), a buffer is not stranded
    when its module's parameters are offloaded (disk, or cpu behind a GPU) and the buffer sits
    on the device those layers run on: accelerate keeps buffers there unless told otherwise.
    """
    main = main_device(devices)
    offload = _offload_devices(main) if dispatched else set()
    per: dict[str, dict[Device, int]] = {}
    seen: dict[str, set] = {}
    leader_dev: dict[str, Device | None] = {}
    for r, dev in zip(rows, device_of):
        is_leader = r.name == r.leader
        if is_leader:
            leader_dev[r.name] = dev
        for m in r.owners:
            bucket = seen.get(m)
            if bucket is None:
                bucket = seen[m] = set()
                per[m] = {}
            bucket.add(dev)
            if is_leader and dev is not None and r.kind == "parameter":
                pm = per[m]
                pm[dev] = pm.get(dev, 0) + r.nbytes
    rank = {d: i for i, d in enumerate(devices)}
    primary = {m: max(b, key=lambda d: (b[d], -rank.get(d, len(rank)))) for m, b in per.items() if b}
    findings, primaries, splits, aliases = [], [], [], []
    for r, dev in zip(rows, device_of):
        prim = primary.get(r.module)
        codes = []
        if dev is None:
            codes.append("param-unplaced" if r.kind == "parameter" else "buffer-unplaced")
        elif dev == "meta" and not meta_ok:
            codes.append("meta-leftover")
        alias = None if r.name == r.leader else r.leader
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
               "split": splits, "finding": findings, "bytes": [r.nbytes for r in rows], "alias_of": aliases}
    typed = {"split": bool, "bytes": "int64"}
    return pd.DataFrame({c: pd.Series(v, dtype=typed.get(c, object)) for c, v in columns.items()})


def _map_devices(rows: list[_Row], dm: Mapping[str, Device]) -> list[Device | None]:
    """Each row's device under the map: its own key, else the key covering its module."""
    by_module: dict[str, Device | None] = {}
    out = []
    for r in rows:
        dev = dm.get(r.name)
        if dev is None and r.name not in dm:
            dev = by_module.get(r.module, _MISSING)
            if dev is _MISSING:
                dev = by_module[r.module] = _lookup(dm, r.module)[1]
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
    model = require_module(model, "audit_device_map")
    dm = normalise_map(device_map)
    rows, _ = _tensor_rows(model)
    return _audit_rows(rows, _map_devices(rows, dm), sorted(set(dm.values()), key=device_order))


def audit(model: nn.Module, device_map: Mapping[str, Any]) -> DeviceMapAudit:
    """:func:`audit_device_map` plus findings (rows and keys), most severe first.

    >>> audit(nn.Linear(2, 2), {"weight": 0, "bias": 0, "nope": 1}).findings[0].code
    'unknown-key'
    """
    dm = normalise_map(device_map)
    rows, modules = _tensor_rows(model)
    table = _audit_rows(rows, _map_devices(rows, dm), sorted(set(dm.values()), key=device_order))
    names = set(modules) | {r.name for r in rows}
    return DeviceMapAudit(table, _key_findings(names, dm) + _table_findings(table))


def audit_findings(model: nn.Module, device_map: Mapping[str, Any]) -> list[Finding]:
    """The findings of :func:`audit`.

    >>> [f.code for f in audit_findings(nn.Linear(2, 2), {"weight": 0})]
    ['param-unplaced']
    """
    return audit(model, device_map).findings


def _finding_message(row: Any, code: str) -> str:
    where = f"{row.kind} {row.name}"
    owner = row.module or "the model"
    if code.endswith("-unplaced"):
        split = f", which the map splits across devices (most parameter bytes on {row.module_primary_device})" \
            if row.split else ""
        return (f"{where} has no device in the map ({owner} owns it directly{split}); dispatch_model leaves "
                f"it where it is, so the forward pass may mix devices. Give it a key, e.g. "
                f"'{row.name}': {row.module_primary_device!r}, or plan with plan_device_map")
    if code == "tie-split":
        return (f"{where} is the same tensor as {row.alias_of} but sits on {row.device}; one tensor on two "
                "devices becomes two copies and the tie breaks. Map both names to one device")
    if code == "buffer-stranded":
        return (f"{where} is on {row.device} but {owner} keeps most parameter bytes on "
                f"{row.module_primary_device}; move the buffer there")
    if code == "meta-leftover":
        return (f"{where} is still on the meta device: it has no values, so a forward pass fails. Load "
                "its weights (a checkpoint) or give it a device")
    return f"{where}: {code}"


def _table_findings(table: pd.DataFrame) -> list[Finding]:
    """One Finding per flagged row; beyond 20 of one code, one summary Finding for the rest."""
    out: list[Finding] = []
    counts: dict[str, int] = {}
    flagged = table[table["finding"].notna()]
    for row in flagged.itertuples(index=False):
        for code in row.finding.split(","):
            counts[code] = counts.get(code, 0) + 1
            if counts[code] <= _MAX_FINDINGS_PER_CODE:
                out.append(Finding(code, _SEVERITY[code], row.name, _finding_message(row, code)))
    for code, n in counts.items():
        if n > _MAX_FINDINGS_PER_CODE:
            out.append(Finding(code, _SEVERITY[code], "",
                               f"{n - _MAX_FINDINGS_PER_CODE} more tensors have {code} (see the table)"))
    order = {"error": 0, "warning": 1, "info": 2}
    return sorted(out, key=lambda f: order[f.severity])


def device_usage(table: pd.DataFrame, budget: Mapping[Device, int] | None = None,
                 reserve: Mapping[Device, int] | None = None) -> pd.DataFrame:
    """Bytes per device from an audit or placement table (each tensor object counted once).

    Columns: ``device, parameter_bytes, buffer_bytes, total_bytes, budget_bytes, reserved_bytes``;
    unassigned tensors are on the row whose device is None.

    >>> m = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))  # params 24 + 16, buffers 16 + 8
    >>> device_usage(audit_device_map(m, {"": "cpu"}))[["device", "parameter_bytes", "buffer_bytes"]].values.tolist()
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
    model = require_module(model, "placement_table")
    rows, _ = _tensor_rows(model)
    modules = dict(model.named_modules(remove_duplicate=False))
    device_of: list[Device | None] = []
    offloaded = False
    for r in rows:
        dev = _torch_device_key(r.tensor)
        if dev == "meta":
            mod = modules[r.module]
            dev = _offloaded_device(mod, r.name[len(r.module) + 1:] if r.module else r.name) or "meta"
            offloaded |= dev != "meta"
        device_of.append(dev)
    all_meta = bool(device_of) and all(d == "meta" for d in device_of)
    devices = sorted({d for d in device_of if d is not None}, key=device_order)
    table = _audit_rows(rows, device_of, devices, meta_ok=all_meta, dispatched=offloaded)
    if has_dtensors(r.tensor for r in rows):  # FSDP2 / tensor parallel: bytes per rank
        from .distributed.analyses import with_rank_bytes
        table = with_rank_bytes(table, model)
    return table


def placement_findings(model: nn.Module) -> list[Finding]:
    """Findings of :func:`placement_table`, plus an info line for a structure-only model.

    >>> [f.code for f in placement_findings(nn.Linear(2, 2, device="meta"))]
    ['meta-model']
    """
    table = placement_table(model)
    out = _table_findings(table)
    if len(table) and (table["device"] == "meta").all():
        out.append(Finding("meta-model", "info", "",
                           f"all {len(table)} tensors are on the meta device: the model is structure only, "
                           "so plans and audits work but it cannot be dispatched or run"))
    return out


# ----------------------------------------------------------------------------- compare with accelerate

@dataclass(frozen=True)
class Comparison:
    """Our plan and accelerate's ``infer_auto_device_map`` for one budget, audited side by side.

    ``difference`` has a row for each tensor name whose device or finding differs: ``name,
    kind, ours, accelerate, our_finding, accelerate_finding``. ``*_check`` is None when
    ``accelerate.utils.check_device_map`` accepts the map, else its error message.
    """

    ours: PlanResult
    accelerate_map: dict[str, Device]
    accelerate_audit: pd.DataFrame = field(repr=False)
    accelerate_findings: list[Finding]
    accelerate_usage: pd.DataFrame = field(repr=False)
    difference: pd.DataFrame = field(repr=False)
    our_check: str | None
    accelerate_check: str | None
    our_seconds: float
    accelerate_seconds: float


def check_with_accelerate(model: nn.Module, device_map: Mapping[str, Any]) -> str | None:
    """None if ``accelerate.utils.check_device_map`` accepts the map, else its message.

    Its warning about keys that are tensor names (not modules) is expected for split modules
    and is not reported.

    >>> check_with_accelerate(nn.Linear(2, 2), {"weight": "cpu"})
    'The device_map provided does not give any device for the following parameters: bias'
    """
    from accelerate.utils import check_device_map

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            check_device_map(model, dict(device_map))
    except ValueError as exc:
        return str(exc)
    return None


def accelerate_budget(budget: Mapping[Device, int]) -> dict[int | str, int]:
    """A budget in the form accelerate's ``max_memory`` takes (a fresh dict: accelerate edits it).

    >>> accelerate_budget(parse_max_memory("0=1KiB,cpu=2KiB"))
    {0: 1024, 'cpu': 2048}
    """
    return {d: int(n) for d, n in budget.items()}


def compare_with_accelerate(model: nn.Module, max_memory: str | Mapping[Any, Any],
                            no_split_module_classes: Iterable[str] | str | None = None,
                            dtype: torch.dtype | str | None = None) -> Comparison:
    """Plan with ours and with accelerate's ``infer_auto_device_map``; audit both; diff them.

    accelerate always allows a disk device after the ones in the budget; ours uses disk only
    when the budget names it.

    >>> from sample_models import get_sample
    >>> c = compare_with_accelerate(get_sample("split-block").build(), "0=40000,1=40000,cpu=100000")
    >>> sorted(c.accelerate_audit.loc[c.accelerate_audit["device"].isna(), "name"])
    ['block.pos_table', 'block.scale']
    """
    from accelerate import infer_auto_device_map

    model = require_module(model, "compare_with_accelerate")
    budget = parse_max_memory(max_memory)
    no_split = default_no_split(model, no_split_module_classes)
    t0 = time.perf_counter()
    planned = _plan(model, budget, no_split, dtype)
    t1 = time.perf_counter()
    theirs = infer_auto_device_map(model, max_memory=accelerate_budget(budget),
                                   no_split_module_classes=list(no_split), dtype=dtype)
    t2 = time.perf_counter()
    ours = _explain(model, planned)
    theirs = normalise_map(dict(theirs))
    result = audit(model, theirs)
    usage = device_usage(result.table, budget)
    a, b = ours.audit.set_index("name"), result.table.set_index("name")
    differs = [n for n in a.index if a.at[n, "device"] != b.at[n, "device"]
               or a.at[n, "finding"] != b.at[n, "finding"]]
    diff = pd.DataFrame({"name": differs, "kind": [a.at[n, "kind"] for n in differs],
                         "ours": [a.at[n, "device"] for n in differs],
                         "accelerate": [b.at[n, "device"] for n in differs],
                         "our_finding": [a.at[n, "finding"] for n in differs],
                         "accelerate_finding": [b.at[n, "finding"] for n in differs]})
    return Comparison(ours, theirs, result.table, result.findings, usage, diff.astype(object),
                      check_with_accelerate(model, ours.device_map), check_with_accelerate(model, theirs),
                      t1 - t0, t2 - t1)


# ----------------------------------------------------------------------------- dispatch

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
    result = audit(model, device_map)
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
    out = []
    for dev in sorted(set(normalise_map(device_map).values()), key=device_order):
        if isinstance(dev, int) and not (torch.cuda.is_available() and dev < torch.cuda.device_count()):
            out.append(dev)
        elif dev == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            out.append(dev)
    return out


def _check_devices_exist(dm: Mapping[str, Device]) -> None:
    missing = missing_devices(dm)
    if missing:
        raise InspectorError(f"the map uses {', '.join(map(repr, missing))}, which this machine does not "
                             "have; plan for the devices here (e.g. cpu and disk) to dispatch")


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
    from accelerate.utils import set_module_tensor_to_device

    from .models import ensure_runnable

    model = require_module(model, "dispatch_plan")
    dm = validate_device_map(model, device_map)
    _check_devices_exist(dm)
    if "" in dm and dm[""] == "disk":
        # accelerate cannot offload the root key itself (it finds no tensors under ""): name
        # the root's parts instead, all on disk.
        dev = dm.pop("")
        dm.update({n: dev for n, _ in model.named_children()})
        dm.update({n: dev for n, _ in [*model.named_parameters(recurse=False), *model.named_buffers(recurse=False)]})
    ensure_runnable(model)
    with model_lock(model):
        target = model if in_place else copy.deepcopy(model)
    tmp = None
    if "disk" in dm.values() and offload_folder is None:
        tmp = tempfile.TemporaryDirectory(prefix="inspector-offload-")
        offload_folder = tmp.name
    try:
        with model_lock(target):
            modules = dict(target.named_modules())
            main = main_device(dm.values())
            for key, dev in dm.items():
                if key not in modules:
                    # dispatch_model places and offloads whole modules only: a tensor key (a split
                    # module's own buffer) is moved here, and one mapped to disk stays in memory
                    # on the device where disk layers run.
                    dev = main if dev == "disk" else dev
                    set_module_tensor_to_device(target, key, f"cuda:{dev}" if isinstance(dev, int) else dev)
            with warnings.catch_warnings():
                # check_device_map warns that tensor-name keys are not module names: expected here
                warnings.filterwarnings("ignore", message="The following device_map keys", category=UserWarning)
                dispatch_model(target, device_map=dict(dm), offload_dir=offload_folder)
    except Exception:
        if tmp is not None:
            tmp.cleanup()
        raise
    table = placement_table(target)
    return Dispatched(target, dm, table, _table_findings(table), offload_folder, in_place, tmp)


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
    from .models import call_model, to_device

    loaded.check_runnable()
    inputs = loaded.example_inputs(2)
    with loaded.lock, torch.no_grad():
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
    inv = inventory(model)
    total = inv.sizes[""]
    _, largest = _largest_layer(inv, set(default_no_split(model, None)))
    return {0: int(total * 0.55) + largest, 1: int(total * 0.55), "cpu": 2 * total}
