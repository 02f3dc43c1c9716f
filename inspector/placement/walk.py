"""The planner's walk: fill devices in order, split what does not fit, then place buffers."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..inventory import ModuleTables
from ..utils.findings import InspectorError
from ..utils.units import format_bytes
from .budget import Device, main_device, offload_devices
from .inventory import lookup


@dataclass(frozen=True)
class Decision:
    """One thing the planner decided, and why."""

    step: str  # "budget", "reserve", "place", "split", "next-device", "buffer", "tie", "together", "clean"
    subject: str        # module or tensor name ("" for the whole model or a device-level step)
    device: Device | None
    nbytes: int
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"step": self.step, "subject": self.subject, "device": self.device,
                "bytes": self.nbytes, "reason": self.reason}


@dataclass
class _WalkState:
    assigned: dict[str, Device]
    used: dict[Device, int]
    split: list[str]
    pending: list[tuple[str, str]]  # (name, owner module) of buffers and buffer-only modules
    records: list[Decision]


def budget_records(budget: dict[Device, int]) -> list[Decision]:
    return [Decision("budget", "", d, n, f"device {d} may hold {format_bytes(n)}") for d, n in budget.items()]


def largest_layer(inv: ModuleTables, no_split: set[str]) -> tuple[str, int]:
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


def main_devices(budget: dict[Device, int]) -> list[Device]:
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


def offloads(device_map: Mapping[str, Device], budget: dict[Device, int]) -> bool:
    """Whether anything lands on a device whose layers run elsewhere (cpu after a GPU, disk)."""
    offload = offload_devices(main_device(budget))
    return any(d in offload for d in device_map.values())


class Reserve:
    """Room kept free on a main device: the largest layer still to place (accelerate's rule).

    ``largest[unit]`` is the biggest leaf or no-split module inside ``unit`` (0 for a tensor).
    """

    def __init__(self, inv: ModuleTables, no_split: set[str], main: list[Device]) -> None:
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


def _splittable(inv: ModuleTables, name: str, no_split: set[str]) -> bool:
    return name in inv.children and bool(inv.children[name]) and inv.classes[name] not in no_split


def _units_of(inv: ModuleTables, module: str, state: _WalkState) -> list[str]:
    """What a split module becomes: its own parameters and its children, in order.

    Its own buffers, and children that hold buffers but no parameters, wait until the
    devices of its parameters are known (see :func:`place_pending`).
    """
    units = [n for n in inv.direct[module] if inv.kind_of(n) == "parameter"]
    for n in inv.direct[module]:
        if inv.kind_of(n) == "buffer":
            state.pending.append((n, module))
    for child in inv.children[module]:
        if inv.sizes[child] > 0 and not inv.has_params(child):
            state.pending.append((child, module))
        else:
            units.append(child)
    return units


def walk(inv: ModuleTables, budget: dict[Device, int], capacity: dict[Device, int],
          no_split: set[str], reserve: Reserve | None = None) -> _WalkState:
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
            state.records.append(
                Decision(
                    "place",
                    unit,
                    dev,
                    size,
                    f"fits: {format_bytes(state.used[dev])} of {format_bytes(capacity[dev])} used on {dev}",
                )
            )
        elif _splittable(inv, unit, no_split):
            state.split.append(unit)
            parts = _units_of(inv, unit, state)
            queue.extendleft(reversed(parts))
            state.records.append(
                Decision(
                    "split",
                    unit,
                    dev,
                    size,
                    f"{format_bytes(size)} do not fit the "
                    f"{format_bytes(capacity[dev] - keep - state.used[dev])} left on {dev}; placing its "
                    f"{len(parts)} parts one by one",
                )
            )
        elif i + 1 < len(devices):
            why = "cannot be split" if unit not in inv.children or not inv.children[unit] else \
                f"is a {inv.classes[unit]} (no-split)"
            state.records.append(
                Decision(
                    "next-device",
                    unit,
                    devices[i + 1],
                    size,
                    f"{format_bytes(size)} do not fit the "
                    f"{format_bytes(capacity[dev] - keep - state.used[dev])} left on {dev} "
                    f"and it {why}",
                )
            )
            i += 1
            queue.appendleft(unit)
        else:
            _raise_no_room(inv, budget, capacity, unit, state)
    return state


def _raise_no_room(inv: ModuleTables, budget: dict[Device, int], capacity: dict[Device, int],
                   unit: str, state: _WalkState) -> None:
    need, have = inv.sizes[""], sum(budget.values())
    hint = "" if "disk" in budget else "; add disk=... to offload to disk"
    last = list(budget)[-1]
    given = ", ".join(f"{d}: {format_bytes(n)}" for d, n in budget.items())
    raise InspectorError(
        f"the budget is too small: the model needs {format_bytes(need)} and the budget gives "
        f"{format_bytes(have)} "
        f"({given}). {unit or 'the model'} ({format_bytes(inv.sizes[unit])}) does not fit on the last device "
        f"{last!r} ({format_bytes(capacity[last] - state.used[last])} left there){hint} or raise a budget."
    )



def _primary_device(inv: ModuleTables, device_map: Mapping[str, Device], module: str,
                    devices: list[Device]) -> Device | None:
    """The device holding most of a module's parameter bytes (the earlier device on a tie)."""
    key, dev = lookup(device_map, module)
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


def _neighbour_device(inv: ModuleTables, module: str, owner: str, device_map: Mapping[str, Device],
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


def place_pending(inv: ModuleTables, state: _WalkState, devices: list[Device]) -> list[Decision]:
    """Own buffers of split modules -> the module's primary device; buffer-only modules -> neighbour."""
    records = []
    placed = dict(state.assigned)  # decide from the walk alone, so the order of pending does not matter
    primary: dict[str, Device | None] = {}
    for name, owner in state.pending:
        size = inv.sizes[name]
        if inv.kind_of(name) is not None:  # a buffer the split module owns directly
            if owner not in primary:
                primary[owner] = _primary_device(inv, placed, owner, devices)
            dev = primary[owner]
            dev = dev if dev is not None else devices[0]
            reason = (f"{owner or 'the model'} is split; its own buffer goes to its primary device {dev}, "
                      "which holds most of its parameter bytes")

        else:
            dev, near = _neighbour_device(inv, name, owner, placed, devices)
            dev = devices[0] if dev is None else dev
            reason = (
                f"holds buffers but no parameters; goes with its nearest placed neighbour {near or 'model'}"
            )
        state.assigned[name] = dev
        state.used[dev] += size
        records.append(Decision("buffer", name, dev, size, reason))
    return records

