"""Plotly figure builders, one module per view: data in, go.Figure out.

Pages and commands import the builders from here; importing this package loads plotly
(``import inspector`` does not).

Modules: ``aliases``: the alias graph; ``attribution``: figures for attributions; ``capture``: figures
for activation captures; ``compare``: figures of a comparison; ``distributed``: figures of a distributed
run; ``offsets``: the flat-vector strip; ``palette``: one colour per device for every figure of the
dashboard and the report; ``placement``: device-map figures; ``training``: figures of a training run
over steps; ``training_steps``: figures of a training run along its steps; ``tree``: the module tree as
a treemap.
"""

from __future__ import annotations

from .aliases import alias_graph_figure
from .attribution import completeness_line, conductance_bars, image_overlay, token_heatmap
from .capture import (
    capture_heatmap,
    capture_histogram,
    capture_stats_figure,
    clone_vs_reference_figure,
    heatmap_slice,
    histogram_data,
)
from .compare import module_change_bars, module_rows, run_divergence_figure
from .distributed import grad_norm_figure, memory_figure
from .offsets import layer_norm_bars, offset_strip, strip_segments
from .palette import bytes_axis, device_colour, device_colours, device_key, key_label, readable
from .placement import placement_treemap, usage_bars, usage_side_by_side
from .run_overlay import runs_overlay_figure
from .training import NormGrid, bin_matrix, norm_grid, norm_heatmap, run_norm_grid
from .training_steps import envelope, findings_timeline, loss_norm_figure
from .tree import lens_colours, module_tree_figure, shown_level

__all__ = [
    "alias_graph_figure",
    "capture_heatmap",
    "capture_histogram",
    "capture_stats_figure",
    "clone_vs_reference_figure",
    "completeness_line",
    "conductance_bars",
    "device_colour",
    "device_colours",
    "device_key",
    "grad_norm_figure",
    "image_overlay",
    "key_label",
    "layer_norm_bars",
    "memory_figure",
    "offset_strip",
    "placement_treemap",
    "readable",
    "token_heatmap",
    "usage_bars",
    "usage_side_by_side",
    "NormGrid",
    "bin_matrix",
    "envelope",
    "findings_timeline",
    "loss_norm_figure",
    "runs_overlay_figure",
    "norm_grid",
    "norm_heatmap",
    "run_norm_grid",
    "module_change_bars",
    "module_rows",
    "run_divergence_figure",
    "bytes_axis",
    "lens_colours",
    "module_tree_figure",
    "shown_level",
    "heatmap_slice",
    "histogram_data",
    "strip_segments",
]
