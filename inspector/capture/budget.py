"""The byte budget of a capture: the ``max_bytes`` a capture accepts, and the findings about what
it left out (over the budget, or not a tensor)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..utils.findings import Finding, InspectorError
from ..utils.units import format_bytes
from .results import Skipped

BUDGET = "over the byte budget"  # how a Skipped reason starts when the budget left it out


def check_budget(max_bytes: Any) -> None:
    """A byte budget is None or a finite number of 0 or more (NaN would compare as no limit)."""
    if max_bytes is None:
        return
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, float, np.integer, np.floating)):
        raise InspectorError(f"max_bytes must be a number of bytes (or None for no limit), got "
                             f"{type(max_bytes).__name__} {max_bytes!r}")
    if not math.isfinite(max_bytes):
        raise InspectorError(
            f"max_bytes must be a finite number of bytes (or None for no limit), got {max_bytes}"
        )
    if max_bytes < 0:
        raise InspectorError(f"max_bytes must be 0 or more (or None for no limit), got {max_bytes}")


def budget_findings(skipped: list[Skipped], max_bytes: int | None) -> list[Finding]:
    found = []
    over = [s for s in skipped if s.reason.startswith(BUDGET)]
    if max_bytes == 0:
        found.append(Finding("capture-budget-zero", "warning", "",
                             "max_bytes is 0, so nothing was captured; give a positive byte "
                             "budget, or None for no limit"))
    elif over:
        found.append(Finding("capture-over-budget", "info", over[0].module,
                             f"the byte budget of {format_bytes(max_bytes)} was reached at "
                             f"{over[0].module}; {len(over)} captures were skipped "
                             f"({format_bytes(sum(s.bytes for s in over))})"))
    for s in skipped:
        if not s.reason.startswith(BUDGET):
            found.append(Finding("capture-not-tensor", "info", s.module, f"{s.module}{s.path}: {s.reason}"))
    return found
