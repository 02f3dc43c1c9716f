"""Names in a device map: the prefixes of a name and the map key that covers it."""

from __future__ import annotations

from collections.abc import Mapping

from .budget import Device


def prefixes(module: str) -> list[str]:
    """'a.b' -> ['', 'a', 'a.b']."""
    if not module:
        return [""]
    parts = module.split(".")
    return [""] + [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def parent_name(name: str) -> str:
    return name.rpartition(".")[0]


def lookup(device_map: Mapping[str, Device], name: str) -> tuple[str | None, Device | None]:
    """The map key covering ``name`` (the longest prefix) and its device."""
    probe = name
    while True:
        if probe in device_map:
            return probe, device_map[probe]
        if not probe:
            return None, None
        probe = parent_name(probe)
