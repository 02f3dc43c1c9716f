"""The aliases section: alias groups, disjoint views, and what each conversion does to them."""

from __future__ import annotations

from typing import Any

from ...aliases import CONVERSIONS, alias_analysis, conversion_table, graph_data
from ...structure.summary import model_bytes
from ...utils.dtensors import model_has_dtensors
from ...utils.findings import InspectorError
from ...utils.units import format_bytes
from ..data import Section, Table, make_figure, plain
from ..options import SECTION_TITLES, how_to
from .context import Context


def aliases_section(ctx: Context) -> Section:
    from ...figures.aliases import alias_graph_figure
    with ctx.loaded.lock:
        analysis = alias_analysis(ctx.model)
    notes: list[str] = []
    facts: dict[str, Any] = {
        "alias_groups": len(analysis.groups), "names": analysis.names,
        "unique_elements": analysis.unique_numel, "elements_with_aliases": analysis.numel_with_aliases,
        "identity_only": analysis.identity_only, "disjoint_views": len(analysis.disjoint)}
    tables = [Table.from_frame("Alias groups", analysis.to_frame(),
                               "names[0] is the name named_parameters() keeps")]
    if analysis.disjoint:
        tables.append(
            Table(
                "Disjoint views of one storage (not aliases)",
                ("regions", "storage_bytes", "device"),
                tuple(
                    (" | ".join(", ".join(r) for r in d.regions), d.storage_nbytes, d.device)
                    for d in analysis.disjoint
                ),
            )
        )
    figures = (
        make_figure(
            "Alias graph", alias_graph_figure(graph_data(ctx.model, list(analysis.groups))), tables[0]
        ),
    )
    names = _conversions(ctx, notes)
    if names:
        table, _results = conversion_table(ctx.model, names)
        tables.append(Table.from_frame(
            "Conversions (each run on a copy of the model)", table,
            "what each conversion does to every alias group; the model itself is not changed"))
        facts["conversions_checked"] = len(names)
    return Section("aliases", SECTION_TITLES["aliases"], note="; ".join(notes), facts=plain(facts),
                   tables=tuple(tables), figures=figures, findings=tuple(analysis.findings))


def _on_cuda(model) -> bool:
    return any(t.device.type == "cuda" for t in (*model.parameters(), *model.buffers()))


def _conversions(ctx: Context, notes: list[str]) -> list[str]:
    choice = ctx.options["conversions"]
    if not choice:
        return []
    known = list(CONVERSIONS)
    if model_has_dtensors(ctx.model):
        notes.append(
            "conversion checks skipped: the parameters are DTensors (FSDP2 or tensor parallel) and each "
            "check converts a copy of the model, which a sharded module cannot make; run them on the "
            "model before sharding it"
        )
        return []
    if choice in ("all", "auto") and not _on_cuda(ctx.model):
        known.remove("cuda")
        notes.append("Module.cuda() left out: the model is not on a CUDA device")
    if choice == "all":
        return known
    if choice == "auto":
        size, limit = model_bytes(ctx.model), int(ctx.options["conversion_max_bytes"])
        if size > limit:
            notes.append(
                f"conversion checks left out: each copies the model ({format_bytes(size)}, more than "
                f"the {format_bytes(limit)} checked by default); {how_to(ctx.options, 'conversions')}"
            )
            return []
        return known
    names = [choice] if isinstance(choice, str) else list(choice)
    bad = [n for n in names if n not in known]
    if bad:
        raise InspectorError(f"unknown conversion(s) {', '.join(bad)}; choose from {', '.join(known)}")
    return names
