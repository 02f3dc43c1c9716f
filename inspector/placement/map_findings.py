"""Findings of a device-map audit: about the map's keys (unknown, overlapping), and one per
flagged row of an audit or placement table, with what to do about it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..utils.codes import CODES
from ..utils.findings import Finding, Severity
from .budget import Device
from .inventory import parent_name

_SEVERITY: dict[str, Severity] = {c: CODES[c].severity for c in (
    "param-unplaced", "buffer-unplaced", "tie-split", "meta-leftover", "buffer-stranded", "unknown-key",
    "overlapping-key")}
_MAX_FINDINGS_PER_CODE = 20


def key_findings(names: set[str], device_map: Mapping[str, Device]) -> list[Finding]:
    """unknown-key and overlapping-key findings; ``names`` holds every module and tensor name."""
    findings = []
    for key in device_map:
        if key and key not in names:
            findings.append(Finding("unknown-key", "error", key,
                                    f"device map key {key!r} names no module, parameter or buffer of the "
                                    "model; fix its spelling or remove it"))
        parent = key
        while parent:
            parent = parent_name(parent)
            if parent in device_map:
                findings.append(
                    Finding(
                        "overlapping-key",
                        "warning",
                        key,
                        f"device map keys {parent!r} and {key!r} overlap: {key} says "
                        f"{device_map[key]} inside {parent or 'the model'} on {device_map[parent]}; "
                        "keep one of them",
                    )
                )
                break
    return findings


def _finding_message(row: Any, code: str) -> str:
    where = f"{row.kind} {row.name}"
    owner = row.module or "the model"
    if code.endswith("-unplaced"):
        split = (
            f", which the map splits across devices (most parameter bytes on {row.module_primary_device})"
            if row.split
            else ""
        )
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


def table_findings(table: pd.DataFrame) -> list[Finding]:
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
