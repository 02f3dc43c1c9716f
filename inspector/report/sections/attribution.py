"""The attribution section: one captum method on the example input, with its completeness check.

captum is imported when the section runs: without it the section is skipped and says why.
"""

from __future__ import annotations

from typing import Any

from ...structure.summary import model_bytes
from ...utils.units import format_bytes
from ..data import ReportFigure, Section, Table, make_figure, plain
from ..options import SECTION_TITLES, how_to
from .context import Context, SectionUnavailable


def attribution_section(ctx: Context) -> Section:
    ctx.loaded.check_runnable()
    _check_size(ctx)
    try:
        from ...attribution import METHODS, attribute, methods_for
        from ...figures.attribution import completeness_line, conductance_bars, image_overlay, token_heatmap
    except ImportError as exc:
        raise SectionUnavailable(f"inspector.attribution is not available ({exc})") from None
    opts = ctx.options
    inputs = ctx.loaded.example_inputs(1)
    method = opts["attribution_method"] or methods_for(ctx.loaded, inputs)[0]
    extra: dict[str, Any] = {}
    if opts["attribution_steps"] is not None and method in METHODS and METHODS[method].has_delta:
        extra["n_steps"] = int(opts["attribution_steps"])
    result = attribute(ctx.loaded, inputs, method, opts["attribution_target"], opts["attribution_layer"],
                       **extra)
    facts: dict[str, Any] = {"method": result.method, "captum_method": result.captum_method,
                             "target": result.target, "position": result.position, "layer": result.layer}
    comp = result.completeness()
    if comp is not None:
        facts.update({"max_abs_delta": comp.max_abs_delta, "max_relative_delta": comp.max_relative,
                      "trusted": comp.trusted})
    tables = [Table.from_frame("Attribution scores", result.summary)]
    figure: ReportFigure
    if result.token_model:
        figure = make_figure("Attribution per token", token_heatmap(result), tables[0])
    elif result.pixel_map() is not None:
        figure = make_figure("Attribution over the input", image_overlay(result), tables[0])
    else:
        figure = make_figure("Attribution per unit", conductance_bars(result), tables[0])
    return Section("attribution", SECTION_TITLES["attribution"], note=completeness_line(result),
                   facts=plain(facts), tables=tuple(tables), figures=(figure,),
                   findings=tuple(result.findings))


def _check_size(ctx: Context) -> None:
    """SectionUnavailable when the model is too big to attribute on a CPU (option
    attribution_cpu_max_bytes)."""
    limit = ctx.options["attribution_cpu_max_bytes"]
    size = model_bytes(ctx.model)
    if limit is not None and ctx.loaded.input_device().type == "cpu" and size > int(limit):
        raise SectionUnavailable(
            f"attribution left out: the model holds {format_bytes(size)} on the CPU, more than the "
            f"{format_bytes(int(limit))} attributed there by default; Integrated Gradients runs about 50 "
            f"forward and backward passes of it. Load it on a GPU, or "
            f"{how_to(ctx.options, 'attribution_cpu_max_bytes')}.")
