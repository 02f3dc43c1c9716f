"""The compare section: what changed from the loaded model (A) to another model or checkpoint (B)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...comparison import WeightComparison, compare
from ..data import Section, Table, make_figure, plain
from ..options import SECTION_TITLES, how_to
from .context import Context, SectionUnavailable

TENSOR_TABLE_COLUMNS = ["name", "name_b", "status", "shape_a", "shape_b", "dtype_a", "dtype_b", "device_a",
                        "device_b", "trainable", "bitwise_equal", "max_abs", "rel_change", "nonfinite_a",
                        "nonfinite_b"]


def compare_section(ctx: Context) -> Section:
    """Compare the report's model with ``compare_with`` (a source, a checkpoint file or folder)."""
    other = ctx.options["compare_with"]
    if other is None:
        raise SectionUnavailable(f"nothing to compare with: {how_to(ctx.options, 'compare_with')}")
    with ctx.loaded.lock:
        result = compare(ctx.loaded, other, device=str(ctx.loaded.device), progress=ctx.progress)
    assert isinstance(result, WeightComparison)
    return section_of(result, _label(other))


def _label(other: Any) -> str:
    text = str(other)
    return Path(text).name if not text.startswith(("sample:", "hf:")) and ".py:" not in text else text


def section_of(result: WeightComparison, b_label: str | None = None) -> Section:
    """A report section of a weight comparison: facts, the per-module figure, modules and tensors,
    findings."""
    from ...figures.compare import module_change_bars

    facts: dict[str, Any] = {"a": result.a, "b": b_label or result.b, "a_kind": result.a_kind,
                             "b_kind": result.b_kind, **result.facts}
    tensors = result.tensors[TENSOR_TABLE_COLUMNS]
    changed = tensors[tensors["status"] != "equal"]
    tables = (Table.from_frame("Change per module, in model order", result.modules,
                               "norms summed over the module's tensors; rel_change is ‖B−A‖/‖A‖"),
              Table.from_frame("Tensors that differ", changed,
                               "every tensor whose status is not 'equal' (bitwise equal in A and B)"),
              Table.from_frame("Every tensor", tensors),
              Table("Renamed tensors", ("name in A", "name in B"), tuple(result.renamed)))
    figure = make_figure("Change per module", module_change_bars(result.modules), tables[0])
    return Section("compare", SECTION_TITLES["compare"], facts=plain(facts), tables=tables, figures=(figure,),
                   findings=tuple(result.findings))
