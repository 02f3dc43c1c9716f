"""Findings about the ranks of a run that hold pieces of one tensor."""

from __future__ import annotations

from typing import Any

from ..utils.findings import Finding


def ranks_text(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0, 1 and 3``."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks[:-1]) + f" and {ranks[-1]}"


def nonfinite_by_rank(row: dict[str, Any]) -> list[Finding]:
    """``nonfinite-gradient`` naming the ranks whose local piece of a tensor's gradient holds NaN/Inf."""
    bad = [r for r, (n, i) in enumerate(zip(row["nan"], row["inf"], strict=True)) if n or i]
    if not bad:
        return []
    counts = "; ".join(f"rank {r}: {row['nan'][r]} NaN, {row['inf'][r]} Inf" for r in bad)
    fine = [r for r in range(len(row["nan"])) if r not in bad]
    tail = f"; {ranks_text(fine)} {'is' if len(fine) == 1 else 'are'} finite" if fine else ""
    return [Finding(
        "nonfinite-gradient", "error", row["name"],
        f"the gradient of {row['name']} is not finite on {ranks_text(bad)} ({counts} in the local "
        f"piece){tail}. The next optimizer step spreads it to the weights; look at that rank's "
        "data batch and loss.")]
