"""Model Inspector: debug PyTorch models — ties, flat offsets, device maps, captures.

The public API is flat; the modules behind it are loaded on first use::

    from inspector import load_model, alias_groups, offset_map, plan_device_map
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_API: dict[str, str] = {
    "load_model": "models", "LoadedModel": "models",
    "available_devices": "devices", "move_model": "devices",
    "alias_groups": "aliases", "snapshot_ties": "aliases", "compare_ties": "aliases",
    "retie": "aliases", "alias_analysis": "aliases", "conversion_check": "aliases",
    "offset_map": "offsets", "locate": "offsets", "gradient_norms": "offsets",
    "plan_device_map": "placement", "audit_device_map": "placement",
    "placement_table": "placement", "plan_device_map_explained": "placement",
    "parse_max_memory": "placement", "compare_with_accelerate": "placement", "dispatch_plan": "placement",
    "capture_activations": "capture", "capturing": "capture", "Captures": "capture",
    "attribute": "attribution",
    "build_report": "report",
    "Finding": "findings", "InspectorError": "findings",
    "model_summary": "summary",
}

__all__ = sorted(_API)

def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'inspector' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
