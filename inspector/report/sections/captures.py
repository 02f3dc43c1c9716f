"""The captures section: detached copies of every module's output, and what changed in place."""

from __future__ import annotations

from ...capture import capture_activations
from ...utils.units import format_bytes
from ..data import Section, Table, make_figure, plain
from ..options import SECTION_TITLES
from .context import Context


def captures_section(ctx: Context) -> Section:
    from ...figures.capture import capture_stats_figure
    ctx.loaded.check_runnable()
    inputs = ctx.loaded.example_inputs(int(ctx.options["batch_size"]))
    caps = capture_activations(ctx.model, inputs, store_on="cpu",
                               max_bytes=ctx.options["capture_max_bytes"])
    facts = {"captured": len(caps.outputs), "bytes": caps.total_bytes, "size": format_bytes(caps.total_bytes),
             "mutated": len(caps.mutated), "mutated_modules": ", ".join(sorted(caps.mutated)) or "none",
             "skipped": len(caps.skipped)}
    tables = [Table.from_frame("Captured outputs (detached copies)", caps.stats,
                               "statistics of each copy; mutated: the live output was changed in place "
                               "after the capture")]
    if caps.mutations:
        tables.append(Table("Outputs changed in place after capture",
                            ("module", "path", "overwritten_by", "detected_by", "max_abs_change"),
                            tuple((m.module, m.path, m.by, m.how, plain(m.max_abs_change))
                                  for m in caps.mutations)))
    if caps.skipped:
        tables.append(Table.from_frame("Not captured", caps.skipped_table))
    figures = (make_figure("Activation statistics", capture_stats_figure(caps.stats), tables[0]),)
    return Section("captures", SECTION_TITLES["captures"], facts=plain(facts),
                   tables=tuple(tables), figures=figures, findings=tuple(caps.findings))
