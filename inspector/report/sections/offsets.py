"""The offsets section: the flat offset map, and gradient norms where there are gradients."""

from __future__ import annotations

from typing import Any

from ...inventory import tensor_inventory
from ...offsets import gradient_report, loss_gradients, offset_findings, offset_map
from ..data import ReportFigure, Section, Table, make_figure, plain
from ..options import SECTION_TITLES, how_to
from .context import Context


def offsets_section(ctx: Context) -> Section:
    from ...figures.offsets import layer_norm_bars, offset_strip
    notes: list[str] = []
    model = ctx.model
    table = offset_map(model)
    findings = list(offset_findings(model))
    facts: dict[str, Any] = {
        "tensors": len(table),
        "vector_length": int(table["end"].max()) if len(table) else 0,
    }
    tables = [Table.from_frame("Flat offset map", table,
                               "rows in parameters() order: parameters_to_vector(...)[start:end] is each "
                               "tensor flattened")]
    trainable = None
    if len(table) and not table["requires_grad"].all():  # some parameter is frozen
        trainable = offset_map(model, trainable_only=True)
        tables.append(Table.from_frame("Flat offset map of the trainable parameters only", trainable,
                                       "frozen parameters are left out, so later offsets move left"))
    grads = _gradients(ctx, notes)
    strip = offset_strip(table, trainable, None if grads is None else grads.by_parameter)
    figures: tuple[ReportFigure, ...] = (make_figure("Flat vector", strip, tables[0]),)
    if grads is not None:
        tables.append(Table.from_frame("Gradient norms per parameter", grads.by_parameter))
        tables.append(Table.from_frame("Gradient norms per module", grads.by_module))
        facts.update(
            {"total_gradient_norm": grads.total_norm, **{f"grad_{k}": v for k, v in grads.counts.items()}}
        )
        findings += grads.findings
        figures += (make_figure("Gradient norm per layer", layer_norm_bars(grads.by_module), tables[-1]),)
    return Section("offsets", SECTION_TITLES["offsets"], note="; ".join(notes), facts=plain(facts),
                   tables=tuple(tables), figures=figures, findings=tuple(findings))


def _gradients(ctx: Context, notes: list[str]) -> Any:
    """Gradient norms from the ``gradients`` option, the model's ``.grad``, or one backward pass if asked.

    The backward pass for the report uses ``torch.autograd.grad``: no ``.grad`` is set.
    """
    model = ctx.model
    given = ctx.options["gradients"]
    if not ctx.options["backward"]:
        if given:
            with ctx.loaded.lock:
                return gradient_report(model, grads=given)
        if given is None and any(e.tensor.grad is not None
                                 for e in tensor_inventory(model, include_buffers=False).unique_entries()):
            with ctx.loaded.lock:
                return gradient_report(model)
        notes.append(f"no gradients yet: gradient norms left out ({how_to(ctx.options, 'backward')})")
        return None
    result = loss_gradients(ctx.loaded, batch_size=int(ctx.options["batch_size"]))
    with ctx.loaded.lock:
        grads = gradient_report(model, grads=result.grads)
    notes.append(result.message)
    return grads
