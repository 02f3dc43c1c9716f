"""Devices and budgets: device names in accelerate's map format, sizes, ``max_memory`` text."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from ..utils.findings import InspectorError
from ..utils.sizes import parse_size
from ..utils.units import format_bytes

Device = int | str  # GPU index, "mps", "cpu" or "disk"

DEVICE_KINDS = ("mps", "cpu", "disk")


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


def torch_device_key(t: torch.Tensor) -> Device:
    kind = t.device.type
    if kind == "cuda":
        return t.device.index or 0
    return kind


def main_device(devices: Iterable[Any]) -> Device:
    """Where offloaded layers run: the first GPU, else mps, else cpu (as ``dispatch_model`` does).

    >>> main_device(["cpu", 1, "disk", 0]), main_device(["cpu", "disk"])
    (0, 'cpu')
    """
    devs = [d for d in devices if d is not None]
    gpus = sorted(d for d in devs if isinstance(d, int))
    return gpus[0] if gpus else "mps" if "mps" in devs else "cpu"


def offload_devices(main: Device) -> set[Device]:
    """Devices whose tensors run on ``main``: disk, and cpu too when a GPU leads."""
    return {"disk"} if main in ("cpu", "mps") else {"cpu", "disk"}


def budget_text(n: int) -> str:
    """A budget as an editor shows it and :func:`parse_max_memory` reads back (binary units, no space).

    >>> budget_text(155_171_243_763)
    '144.51GiB'
    """
    return format_bytes(n, 2).replace(" ", "")
