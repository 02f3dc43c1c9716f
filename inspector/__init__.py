"""Model Inspector: debug PyTorch models — ties, flat offsets, device maps, captures.

The public API is flat: every function and result type below is imported from here::

    from inspector import load_model, alias_groups, offset_map, plan_device_map

``import inspector`` loads torch, numpy and pandas; transformers, accelerate, captum, plotly
and streamlit are imported only by the calls that use them.
"""

from __future__ import annotations

from .aliases import (
    CONVERSIONS,
    AliasAnalysis,
    AliasGroup,
    ConversionResult,
    GraphData,
    TieSnapshot,
    alias_analysis,
    alias_groups,
    compare_ties,
    conversion_check,
    conversion_table,
    graph_data,
    retie,
    snapshot_ties,
)
from .attribution import METHODS, Attribution, AttributionResult, attribute, methods_for
from .capture import Captures, capture_activations, capturing, reference_drift, select_modules
from .comparison import RunComparison, WeightComparison, compare
from .inventory import TensorEntry, TensorInventory, storage_key, tensor_inventory
from .loading.checkpoints import apply_checkpoint, read_checkpoint
from .loading.devices import DeviceInfo, available_devices, device_names, move_model
from .loading.listing import checkpoint_listing
from .loading.models import LoadedModel, load_model
from .offsets import (
    BackwardResult,
    GradientNorms,
    Location,
    LossGradients,
    gradient_norms,
    gradient_report,
    locate,
    loss_gradients,
    offset_findings,
    offset_map,
    run_backward,
)
from .placement import (
    Comparison,
    DeviceMapAudit,
    PlacementPlan,
    PlanResult,
    audit_device_map,
    compare_with_accelerate,
    dispatch_plan,
    parse_max_memory,
    placement_findings,
    placement_table,
    plan_device_map,
    plan_device_map_explained,
)
from .report import SECTIONS, Report, build_report, run_report
from .structure.summary import (
    ModelSummary,
    format_bytes,
    format_count,
    model_summary,
    summary_findings,
    tensor_table,
)
from .structure.tree import LENSES, ModuleTree, module_tree, tensor_badges
from .utils.findings import Finding, InspectorError, sort_findings
from .utils.program import VERSION
from .utils.units import format_number
from .watching import Run, StepFinding, WatchResult, read_run, watch

__version__ = VERSION

__all__ = [
    "CONVERSIONS",
    "METHODS",
    "SECTIONS",
    "AliasAnalysis",
    "AliasGroup",
    "Attribution",
    "AttributionResult",
    "BackwardResult",
    "Captures",
    "Comparison",
    "ConversionResult",
    "DeviceInfo",
    "GraphData",
    "DeviceMapAudit",
    "Finding",
    "GradientNorms",
    "InspectorError",
    "LoadedModel",
    "Location",
    "LossGradients",
    "ModelSummary",
    "PlacementPlan",
    "PlanResult",
    "Report",
    "TensorEntry",
    "TensorInventory",
    "TieSnapshot",
    "alias_analysis",
    "alias_groups",
    "attribute",
    "audit_device_map",
    "available_devices",
    "build_report",
    "capture_activations",
    "capturing",
    "compare_ties",
    "compare_with_accelerate",
    "conversion_check",
    "conversion_table",
    "device_names",
    "dispatch_plan",
    "format_bytes",
    "format_count",
    "gradient_norms",
    "graph_data",
    "gradient_report",
    "load_model",
    "locate",
    "loss_gradients",
    "methods_for",
    "model_summary",
    "move_model",
    "offset_findings",
    "offset_map",
    "parse_max_memory",
    "placement_findings",
    "placement_table",
    "reference_drift",
    "plan_device_map",
    "plan_device_map_explained",
    "retie",
    "run_backward",
    "run_report",
    "select_modules",
    "snapshot_ties",
    "sort_findings",
    "storage_key",
    "summary_findings",
    "tensor_inventory",
    "tensor_table",
    "Run",
    "StepFinding",
    "WatchResult",
    "read_run",
    "watch",
    "RunComparison",
    "WeightComparison",
    "compare",
    "LENSES",
    "ModuleTree",
    "format_number",
    "module_tree",
    "tensor_badges",
    "apply_checkpoint",
    "checkpoint_listing",
    "read_checkpoint",
]
