"""What a model is made of: modules, parameter elements (unique and with aliases), buffers, bytes."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
from torch import nn

from ..inventory import tensor_inventory
from ..utils.checks import require_module
from ..utils.findings import Finding
from ..utils.units import format_bytes, format_count

__all__ = ["ModelSummary", "format_bytes", "format_count", "model_bytes", "model_summary", "summary_findings",
           "tensor_table"]


@dataclass(frozen=True)
class ModelSummary:
    """Counts for the home page, the ``summary`` command and reports.

    ``parameter_elements`` counts each Parameter object once (what ``parameters()`` yields);
    ``parameter_elements_with_aliases`` counts every name (``remove_duplicate=False``).
    """

    modules: int
    parameters: int
    parameter_names: int
    parameter_elements: int
    parameter_elements_with_aliases: int
    trainable_elements: int
    frozen_elements: int
    buffers: int
    buffer_elements: int
    bytes_table: pd.DataFrame = field(repr=False)  # columns: kind, dtype, device, tensors, elements, bytes
    aliases: tuple[tuple[str, str], ...] = ()  # (alias name, the name parameters() keeps for it)

    @property
    def aliased_elements(self) -> int:
        return self.parameter_elements_with_aliases - self.parameter_elements

    def as_dict(self) -> dict:
        return {
            "modules": self.modules, "parameters": self.parameters,
            "parameter_names": self.parameter_names,
            "parameter_elements": self.parameter_elements,
            "parameter_elements_with_aliases": self.parameter_elements_with_aliases,
            "aliased_elements": self.aliased_elements,
            "trainable_elements": self.trainable_elements, "frozen_elements": self.frozen_elements,
            "buffers": self.buffers, "buffer_elements": self.buffer_elements,
            "bytes": self.bytes_table.to_dict(orient="records"),
        }


def model_summary(model: nn.Module) -> ModelSummary:
    """Count a model's modules, parameters and buffers; metadata only, works on meta.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> s = model_summary(m)
    >>> s.parameter_elements, s.parameter_elements_with_aliases
    (4, 8)
    """
    model = require_module(model, "model_summary")
    inv = tensor_inventory(model)
    names = inv.parameters()
    params = inv.unique_entries("parameter")
    buffers = list({id(e.tensor): e for e in inv.buffers()}.values())  # as buffers() yields them
    rows: dict[tuple[str, str, str], list[int]] = {}
    for kind, entries in (("parameter", params), ("buffer", buffers)):
        for e in entries:
            row = rows.setdefault((kind, e.dtype_name, str(e.device)), [0, 0, 0])
            row[0] += 1
            row[1] += e.numel
            row[2] += e.nbytes
    table = pd.DataFrame([(k, d, dev, n, e, b) for (k, d, dev), (n, e, b) in rows.items()],
                         columns=["kind", "dtype", "device", "tensors", "elements", "bytes"])
    trainable = sum(e.numel for e in params if e.requires_grad)
    total = sum(e.numel for e in params)
    return ModelSummary(
        modules=sum(1 for _ in model.modules()),
        parameters=len(params),
        parameter_names=len(names),
        parameter_elements=total,
        parameter_elements_with_aliases=sum(e.numel for e in names),
        trainable_elements=trainable,
        frozen_elements=total - trainable,
        buffers=len(buffers),
        buffer_elements=sum(e.numel for e in buffers),
        bytes_table=table,
        aliases=tuple((e.name, e.first_name) for e in names if e.is_alias),
    )


def model_bytes(model: nn.Module) -> int:
    """Bytes of every parameter and buffer, each tensor object counted once.

    >>> model_bytes(nn.Linear(2, 3))  # (6 + 3) float32 elements
    36
    """
    return tensor_inventory(model).unique_bytes()


def tensor_table(model: nn.Module) -> pd.DataFrame:
    """Every parameter and buffer name (aliases included) with its shape, dtype and device.

    Metadata only, so it works on the meta device. Columns ``name, kind, shape, numel, dtype,
    device, requires_grad`` (None for a buffer), ``same_as``: the first name of the same
    object when a name is an alias, else ``""``.

    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> list(tensor_table(m)["same_as"])
    ['', '0.weight']
    """
    rows = [
        {
            "name": e.name,
            "kind": e.kind,
            "shape": str(e.shape),
            "numel": e.numel,
            "dtype": e.dtype_name,
            "device": str(e.device),
            "requires_grad": bool(e.requires_grad) if e.kind == "parameter" else None,
            "same_as": e.first_name if e.is_alias else "",
        }
        for e in tensor_inventory(model, what="tensor_table")
    ]
    return pd.DataFrame(rows, columns=["name", "kind", "shape", "numel", "dtype", "device", "requires_grad",
                                       "same_as"])


def summary_findings(summary: ModelSummary) -> list[Finding]:
    """Information worth a line on the home page."""
    out = []
    if summary.aliased_elements:
        pairs = summary.aliases
        named = "; ".join(f"{a} is {b}" for a, b in pairs[:3]) + (
            f"; {len(pairs) - 3} more" if len(pairs) > 3 else ""
        )
        where = pairs[0][0] if pairs else ""
        n = summary.parameter_names - summary.parameters
        names = "1 parameter name is an alias" if n == 1 else f"{n:,} parameter names are aliases"
        out.append(
            Finding(
                "aliases-present",
                "info",
                where,
                f"{names} of another name ({named}): parameters() counts "
                f"{format_count(summary.parameter_elements)} elements, "
                f"{format_count(summary.parameter_elements_with_aliases)} if every name were counted",
            )
        )
    return out
