"""Findings about the ranks of a run that hold pieces of one tensor."""

from __future__ import annotations

from typing import Any

from ..utils.findings import Finding


def about(f: Finding, ranks: list[int] | tuple[int, ...]) -> Finding:
    """``f`` with the ranks it is about kept as data (:func:`ranks_of`; the first is the one at fault
    where one is), not only named in its text. Not part of the finding's fields: it stays in memory."""
    object.__setattr__(f, "ranks", tuple(int(r) for r in ranks))
    return f


def ranks_of(f: Finding) -> tuple[int, ...]:
    """The ranks a finding of the distributed checks is about (empty: the whole world)."""
    return tuple(getattr(f, "ranks", ()))


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
    return [about(Finding(
        "nonfinite-gradient", "error", row["name"],
        f"the gradient of {row['name']} is not finite on {ranks_text(bad)} ({counts} in the local "
        f"piece){tail}. The next optimizer step spreads it to the weights; look at that rank's "
        "data batch and loss."), bad)]
