"""The placement section: where every tensor is now, and the device-map plan for a budget."""

from __future__ import annotations

import warnings
from typing import Any

from ...placement import compare_with_accelerate, placement_table
from ...placement.audits import placement_table_findings
from ...sharding import sharding_tables
from ...utils.units import format_budget
from ..data import ReportFigure, Section, Table, make_figure, plain
from ..options import SECTION_TITLES
from .context import Context


def placement_section(ctx: Context) -> Section:
    from ...figures.placement import placement_treemap
    notes: list[str] = []
    model = ctx.model
    now = placement_table(model)
    findings = placement_table_findings(now)
    tables = [Table.from_frame("Where every parameter and buffer is now", now)]
    facts: dict[str, Any] = {"tensors": len(now),
                             "devices_now": sorted({str(d) for d in now["device"] if d is not None})}
    figures: tuple[ReportFigure, ...] = (
        make_figure("Where every tensor is now", placement_treemap(now), tables[0]),
    )
    budget = ctx.options["max_memory"]
    if budget is None:
        notes.append("no device budget given: the device-map plan is left out (pass max_memory, "
                     "e.g. '0=20GiB,1=20GiB,cpu=64GiB')")
    else:
        plan_tables, plan_figures, plan_findings = _plan(ctx, budget, facts)
        tables += plan_tables
        figures += plan_figures
        findings += plan_findings
    if "bytes_per_rank" in now.columns:  # DTensor parameters (FSDP2, tensor parallel)
        tables += [Table.from_frame(title, df) for title, df in sharding_tables(model, now)]
    return Section("placement", SECTION_TITLES["placement"], note="; ".join(notes), facts=plain(facts),
                   tables=tuple(tables), figures=figures, findings=tuple(findings))


def _plan(ctx: Context, budget: Any, facts: dict[str, Any]
          ) -> tuple[list[Table], tuple[ReportFigure, ...], list[Any]]:
    """The plan for ``budget`` next to accelerate's: its tables, figures and findings; ``facts`` updated."""
    from ...figures.placement import placement_treemap, usage_bars
    with ctx.loaded.lock, warnings.catch_warnings():
        # accelerate warns about its own plan's offloaded buffers; the diff table shows that
        warnings.filterwarnings("ignore", category=UserWarning, module="accelerate")
        comparison = compare_with_accelerate(ctx.model, budget)
    plan = comparison.ours
    facts.update({"budget": format_budget(plan.budget), "map_keys": len(plan.device_map),
                  "accelerate_check": "passed" if comparison.our_check is None else comparison.our_check,
                  "accelerate_infer_auto_device_map_check": "passed" if comparison.accelerate_check is None
                  else comparison.accelerate_check,
                  "accelerate_map_problems": len(comparison.accelerate_findings)})
    tables = [Table("Planned device map", ("key", "device"),
                    tuple((k, plain(v)) for k, v in plan.device_map.items())),
              Table.from_frame("Bytes per device", plan.usage),
              Table.from_frame("Audit of the plan: every parameter and buffer", plan.audit),
              Table.from_frame("Planner decisions", plan.records_frame()),
              Table.from_frame("Where accelerate's infer_auto_device_map differs, same budget",
                               comparison.difference,
                               "for comparison only: these are not findings about this model")]
    figures = (make_figure("Planned device map", placement_treemap(plan.audit), tables[2]),
               make_figure("Bytes per device against the budget", usage_bars(plan.usage), tables[1]))
    return tables, figures, list(plan.findings)
