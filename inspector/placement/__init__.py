"""Device maps: plan one that places every parameter and buffer, audit any map, dispatch.

A device map (accelerate's format) sends module or tensor names to devices: GPU indices
(``0``, ``1``...), ``"mps"``, ``"cpu"`` or ``"disk"``.

- :mod:`.budget`: device names, sizes and ``max_memory`` budgets;
- :mod:`.inventory`: the map key that covers a name;
- :mod:`.plan` (with :mod:`.walk`): :func:`plan_device_map` and its reasons, :class:`PlacementPlan`;
- :mod:`.audits`: :func:`audit_device_map`, :func:`placement_table`; :mod:`.map_findings`: their findings;
- :mod:`.compare`: our plan next to accelerate's ``infer_auto_device_map``;
- :mod:`.dispatch`: :func:`dispatch_plan` with ``accelerate.dispatch_model``.
"""

from __future__ import annotations

from .audits import (
    AUDIT_COLUMNS,
    DeviceMapAudit,
    audit,
    audit_device_map,
    audit_findings,
    device_usage,
    load_device_map,
    normalise_map,
    placement_findings,
    placement_table,
)
from .budget import (
    DEVICE_KINDS,
    Device,
    budget_text,
    device_order,
    format_max_memory,
    main_device,
    normalise_device,
    parse_max_memory,
    parse_size,
)
from .compare import Comparison, accelerate_budget, check_with_accelerate, compare_with_accelerate
from .dispatch import (
    DispatchCheck,
    Dispatched,
    dispatch_plan,
    missing_devices,
    suggest_budget,
    try_dispatch,
    validate_device_map,
)
from .plan import (
    PlacementPlan,
    PlanResult,
    clean_map,
    default_no_split,
    no_split_choices,
    plan_device_map,
    plan_device_map_explained,
)
from .walk import Decision

__all__ = [
    "AUDIT_COLUMNS", "DEVICE_KINDS", "Comparison", "Decision", "Device", "DeviceMapAudit", "DispatchCheck",
    "Dispatched", "PlacementPlan", "PlanResult", "accelerate_budget", "audit",
    "audit_device_map", "audit_findings", "budget_text", "check_with_accelerate", "clean_map",
    "compare_with_accelerate", "default_no_split", "device_order", "device_usage", "dispatch_plan",
    "format_max_memory", "load_device_map", "main_device", "missing_devices", "no_split_choices",
    "normalise_device", "normalise_map", "parse_max_memory", "parse_size", "placement_findings",
    "placement_table", "plan_device_map", "plan_device_map_explained", "suggest_budget", "try_dispatch",
    "validate_device_map",
]
