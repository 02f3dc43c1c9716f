"""Checks made on a model as it is loaded: nesting torch cannot walk, complex tensors a cast keeps."""

from __future__ import annotations

import torch
from torch import nn

from ..utils.findings import Finding, InspectorError
from .devices import COMPLEX_OF

MAX_DEPTH = 200


def refuse_deep_nesting(model: nn.Module, name: str) -> None:
    """Raise when modules nest deeper than :data:`MAX_DEPTH` (walked without recursion)."""
    stack = [(model, 0)]
    seen: set[int] = set()
    while stack:
        module, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InspectorError(f"{name} nests modules more than {MAX_DEPTH} deep; torch walks modules "
                                 "recursively, so no analysis can run on it. Flatten the nesting (an "
                                 "nn.ModuleList or nn.Sequential of the repeated blocks)")
        if id(module) in seen:
            continue
        seen.add(id(module))
        stack.extend((child, depth + 1) for child in module._modules.values() if child is not None)


def complex_cast_findings(model: nn.Module, dtype: torch.dtype | None) -> list[Finding]:
    """An info finding per complex tensor when the model is cast to ``dtype``: it stays complex."""
    if dtype is None:
        return []
    out = []
    for n, t in [*model.named_parameters(), *model.named_buffers()]:
        if t.is_complex():
            kept = COMPLEX_OF.get(dtype, t.dtype)
            out.append(
                Finding(
                    "complex-kept",
                    "info",
                    n,
                    f"{n} is {str(t.dtype).removeprefix('torch.')}: casting the model to "
                    f"{str(dtype).removeprefix('torch.')} made it {str(kept).removeprefix('torch.')}, "
                    "keeping its imaginary part",
                )
            )
    return out
