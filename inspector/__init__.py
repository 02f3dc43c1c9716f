"""Model Inspector: debug PyTorch models — ties, flat offsets, device maps, captures.

The public API is flat: every function and result type is imported from here::

    from inspector import load_model, alias_groups, offset_map, plan_device_map

By job (each call returns a frozen result or a DataFrame, plus :class:`Finding`\\ s):

- load and move: :func:`load_model` (:class:`LoadedModel`), :func:`available_devices`,
  :func:`move_model`, :func:`read_checkpoint`, :func:`apply_checkpoint`, :func:`checkpoint_listing`;
- what a model is made of: :func:`model_summary`, :func:`tensor_table`, :func:`tensor_inventory`
  (the one walk), :func:`module_tree`;
- 1. aliases: :func:`alias_groups`, :func:`alias_analysis`, :func:`snapshot_ties` /
  :func:`compare_ties`, :func:`retie`, :func:`conversion_table`;
- 2. flat offsets and gradients: :func:`offset_map`, :func:`locate`, :func:`gradient_norms`,
  :func:`gradient_report`, :func:`loss_gradients`, :func:`run_backward`;
- 3. device maps: :func:`plan_device_map` (:func:`plan_device_map_explained`),
  :func:`audit_device_map`, :func:`placement_table`, :func:`compare_with_accelerate`, :func:`dispatch_plan`;
- 4. captures: :func:`capture_activations`, ``with capturing(model)``, :func:`select_modules`;
- attributions: :func:`attribute`;
- training runs and comparisons: :func:`watch`, :func:`read_run`, :func:`replay` (a kept step run
  again: :class:`Replay`), :func:`compare`;
- reports: :func:`build_report`, :func:`run_report`.

Subpackages (``inspector.figures``, ``inspector.distributed``, ``inspector.watching``, ...) export
what the dashboard, the command line and distributed training add; ``docs/architecture.md``
places each on its layer. ``import inspector`` loads torch, numpy and pandas; transformers,
accelerate, captum, plotly and streamlit are imported only by the calls that use them.

Modules: ``__main__``: command line: ``python -m inspector COMMAND SOURCE ...``; ``commands``:
subcommands of ``python -m inspector``; one module per command; ``labs``: classroom labs, a model with a
real, silent bug in each; ``loading``: models and checkpoints in; ``runfiles``: ``check_step``'s run
file; ``sharding``: what this rank holds of a model whose tensors are DTensors; ``structure``: what a
model is made of; ``utils``: the floor every layer stands on; ``aliases``: which tensors are really the
same tensor; ``attribution``: captum adapter: which inputs and which layers drove one output;
``capture``: activation capture as detached copies; ``comparison``: compare two models; ``dashboard``:
what the dashboard needs from the library beyond the analyses; ``distributed``: distributed training;
``figures``: plotly figure builders, one module per view: data in, go.Figure out; ``inventory``: one
walk over a model's parameters and buffers; ``offsets``: where each parameter sits in the flat vector;
``placement``: device maps: plan one that places every parameter and buffer; ``report``: reports: every
analysis of one model in one document; ``watching``: watch a training run step by step;
``replaying``: keep the last steps of a watched run and replay one; ``integrations``: the watch
inside training stacks (Trainer, Lightning, accelerate) and exports to
trackers; ``runfolders``: the runs folders the dashboard lists and the only places it opens runs from.
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
from .loading import (
    DeviceInfo,
    LoadedModel,
    apply_checkpoint,
    available_devices,
    checkpoint_listing,
    device_names,
    load_model,
    move_model,
    read_checkpoint,
)
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
from .replaying import Replay, replay
from .report import SECTIONS, Report, build_report, run_report
from .structure import (
    LENSES,
    ModelSummary,
    ModuleTree,
    model_summary,
    module_tree,
    summary_findings,
    tensor_badges,
    tensor_table,
)
from .utils import Finding, InspectorError, format_bytes, format_count, format_number, sort_findings
from .utils.program import VERSION
from .watching import Run, StepFinding, WatchResult, read_run, watch

__version__ = VERSION

__all__ = [
    # load and move
    "DeviceInfo", "LoadedModel", "apply_checkpoint", "available_devices", "checkpoint_listing",
    "device_names", "load_model", "move_model", "read_checkpoint",
    # what a model is made of
    "LENSES", "ModelSummary", "ModuleTree", "TensorEntry", "TensorInventory", "model_summary", "module_tree",
    "storage_key", "summary_findings", "tensor_badges", "tensor_inventory", "tensor_table",
    # 1. aliases
    "CONVERSIONS", "AliasAnalysis", "AliasGroup", "ConversionResult", "GraphData", "TieSnapshot",
    "alias_analysis", "alias_groups", "compare_ties", "conversion_check", "conversion_table", "graph_data",
    "retie", "snapshot_ties",
    # 2. flat offsets and gradients
    "BackwardResult", "GradientNorms", "Location", "LossGradients", "gradient_norms", "gradient_report",
    "locate", "loss_gradients", "offset_findings", "offset_map", "run_backward",
    # 3. device maps
    "Comparison", "DeviceMapAudit", "PlacementPlan", "PlanResult", "audit_device_map",
    "compare_with_accelerate", "dispatch_plan", "parse_max_memory", "placement_findings", "placement_table",
    "plan_device_map", "plan_device_map_explained",
    # 4. captures
    "Captures", "capture_activations", "capturing", "reference_drift", "select_modules",
    # attributions
    "METHODS", "Attribution", "AttributionResult", "attribute", "methods_for",
    # training runs and comparisons
    "Replay", "Run", "RunComparison", "StepFinding", "WatchResult", "WeightComparison", "compare", "read_run",
    "replay", "watch",
    # reports
    "SECTIONS", "Report", "build_report", "run_report",
    # findings and numbers for people
    "Finding", "InspectorError", "format_bytes", "format_count", "format_number", "sort_findings",
]
