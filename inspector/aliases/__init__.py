"""Which tensors are really the same tensor: alias groups, tie snapshots and conversion checks.

* :mod:`.groups`: :func:`alias_groups` / :func:`alias_analysis` (same object, shared storage,
  overlapping views), from one :func:`~inspector.inventory.tensor_inventory` walk;
* :mod:`.ties`: :func:`snapshot_ties`, :func:`compare_ties` and :func:`retie`;
* :mod:`.conversions`: :func:`conversion_check` / :func:`conversion_table` run a conversion on a
  copy of the model and say what became of each tie;
* :mod:`.graph`: the modules and tensors of the alias graph, as data for the figure.

Modules: ``memory``: where tensors sit in their storage.
"""

from __future__ import annotations

from .conversions import (
    CONVERSIONS,
    Conversion,
    ConversionResult,
    conversion_check,
    conversion_table,
    overwrite_on_conversion,
)
from .graph import GraphData, graph_data
from .groups import (
    KINDS,
    AliasAnalysis,
    AliasGroup,
    DisjointViews,
    alias_analysis,
    alias_groups,
    analyse_inventory,
    groups_frame,
)
from .ties import (
    GroupOutcome,
    TensorLayout,
    TieSnapshot,
    compare_ties,
    retie,
    snapshot_inventory,
    snapshot_ties,
)

__all__ = [
    "CONVERSIONS", "KINDS", "AliasAnalysis", "AliasGroup", "Conversion", "ConversionResult", "DisjointViews",
    "GraphData", "GroupOutcome", "TensorLayout", "TieSnapshot", "alias_analysis", "alias_groups",
    "analyse_inventory", "compare_ties", "conversion_check", "conversion_table", "graph_data",
    "groups_frame", "overwrite_on_conversion", "retie", "snapshot_inventory", "snapshot_ties",
]
