"""Grouped findings of a weight comparison: what stayed (and whether that was expected), what grew
from zero, which changes are low-rank, and the one-line summary; every list capped."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from fnmatch import fnmatchcase

import pandas as pd

from ..utils.findings import Finding
from .kernels import LOW_RANK_TOLERANCE

MAX_NAMES = 8
MAX_PER_CODE = 10


def kind_of(name: str) -> str:
    """``name`` with its numbered components as ``*``: the tensors of one kind across layers.

    >>> kind_of("model.layers.12.mlp.up_proj.weight")
    'model.layers.*.mlp.up_proj.weight'
    """
    return re.sub(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)", "*", name)


def matches(name: str, patterns: Sequence[str]) -> bool:
    """Whether ``name`` or one of its module prefixes matches a glob pattern (``*.wte``, ``lm_head*``).

    >>> matches("transformer.wte.weight", ["*wte"]), matches("h.1.w", ["h.1"]), matches("h.10.w", ["h.1"])
    (True, True, False)
    """
    parts = name.split(".")
    prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatchcase(p, pat) for pat in patterns for p in prefixes)


def covering_modules(names: list[str], pool: list[str]) -> list[tuple[str, list[str]]]:
    """``names`` grouped under the largest module prefixes whose every ``pool`` name is in ``names``."""
    chosen = set(names)
    groups: list[tuple[str, list[str]]] = []
    left = list(names)
    while left:
        name = left[0]
        parts = name.split(".")[:-1]
        best = name
        for depth in range(1, len(parts) + 1):
            prefix = ".".join(parts[:depth]) + "."
            if all(n in chosen for n in pool if n.startswith(prefix)):
                best = prefix[:-1]
                break
        under = [n for n in left if n == best or n.startswith(best + ".")]
        groups.append((best, under))
        left = [n for n in left if n not in under]
    return groups


def capped(items: Sequence[str], limit: int = MAX_NAMES) -> str:
    """``a, b, c`` or ``a, b ... and 12 more``."""
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def _group_text(tensors: pd.DataFrame, groups: list[tuple[str, list[str]]]) -> list[str]:
    out = []
    for module, names in groups:
        numel = int(tensors.loc[tensors["name"].isin(names), "numel"].sum())
        out.append(f"{names[0]} ({numel} elements)" if len(names) == 1 else
                   f"all {len(names)} trainable tensors of {module} ({numel} elements)")
    return out


def summary_line(tensors: pd.DataFrame) -> str:
    """``26 of 28 tensors changed; 2 unchanged: wte, wpe`` (unchanged ones grouped by module)."""
    compared = tensors[tensors["bitwise_equal"].notna() & (tensors["name"] != "")]
    same = compared.loc[compared["bitwise_equal"] == True, "name"].tolist()  # noqa: E712
    text = f"{len(compared) - len(same)} of {len(compared)} tensors changed"
    if same and len(same) < len(compared):
        groups = [m for m, _ in covering_modules(same, compared["name"].tolist())]
        text += f"; {len(same)} unchanged: {capped(groups, 5)}"
    return text


def unchanged_findings(sb_label: str, tensors: pd.DataFrame, expect_unchanged: Sequence[str] = ()
                       ) -> list[Finding]:
    """Trainable tensors bitwise identical in B while others changed, in at most three findings.

    ``unchanged-tensor`` (warning): tensors of a kind (name with layer numbers as ``*``) that changed
    elsewhere. ``unchanged-expected`` (info): those matching ``expect_unchanged``, and a frozen set
    whose every tensor of its kind stayed (embeddings of a fine-tune, all but the adapted
    projections of a merged adapter).
    """
    pool_rows = tensors[tensors["trainable"] & tensors["status"].isin(["equal", "changed", "dtype-changed"])]
    if not (pool_rows["status"] != "equal").any():
        return expectation_findings(tensors, expect_unchanged)
    pool = pool_rows["name"].tolist()
    same = pool_rows.loc[pool_rows["status"] == "equal", "name"].tolist()
    moved_kinds = {kind_of(n) for n in pool_rows.loc[pool_rows["status"] != "equal", "name"]}
    expected = [n for n in same if expect_unchanged and matches(n, expect_unchanged)]
    odd = [n for n in same if n not in set(expected) and kind_of(n) in moved_kinds]
    frozen = [n for n in same if n not in set(expected) and n not in set(odd)]
    out = []
    if odd:
        groups = covering_modules(odd, pool)
        out.append(Finding(
            "unchanged-tensor", "warning", groups[0][0],
            f"{len(odd)} of {len(pool)} trainable tensors are bitwise identical in {sb_label} although "
            f"tensors of the same kind changed: {capped(_group_text(tensors, groups), 5)}. Frozen by "
            "mistake, left out of the optimizer, or a load that never happened; if intended, say so "
            "with --expect-unchanged PATTERN"))
    if expected:
        groups = covering_modules(expected, pool)
        out.append(Finding("unchanged-expected", "info", groups[0][0],
                           f"{len(expected)} tensors are unchanged as expected ("
                           f"{', '.join(expect_unchanged)}): {capped([m for m, _ in groups])}"))
    if frozen:
        groups = covering_modules(frozen, pool)
        kinds = list(dict.fromkeys(kind_of(n) for n in frozen))
        out.append(Finding("unchanged-expected", "info", groups[0][0],
                           f"{len(frozen)} tensors form a frozen set ({capped([m for m, _ in groups], 5)}): "
                           f"every tensor of their kind ({len(kinds)} kinds: {capped(kinds, 5)}) is "
                           f"unchanged while {len(pool) - len(same)} others changed"))
    return out + expectation_findings(tensors, expect_unchanged)


def expectation_findings(tensors: pd.DataFrame, expect_unchanged: Sequence[str]) -> list[Finding]:
    """Warnings where ``expect_unchanged`` was wrong: a tensor it names changed
    (``changed-unexpectedly``), or a pattern names no tensor at all (``expect-unmatched``: a typo
    would otherwise pass silently)."""
    if not expect_unchanged:
        return []
    names = [n for n in tensors["name"].tolist() + tensors["name_b"].tolist() if n]
    out = [Finding("expect-unmatched", "warning", pattern,
                   f"the expect-unchanged pattern {pattern!r} matches no tensor name or module prefix of "
                   "either side; check its spelling (a glob such as '*.wte' or 'model.layers.*.mlp')")
           for pattern in expect_unchanged if not any(matches(n, [pattern]) for n in names)]
    moved = [n for n in tensors.loc[tensors["status"].isin(["changed", "dtype-changed"]), "name"]
             if matches(n, expect_unchanged)]
    if moved:
        out.append(Finding("changed-unexpectedly", "warning", moved[0],
                           f"{len(moved)} tensors expected unchanged ({', '.join(expect_unchanged)}) "
                           f"changed: {capped(moved)}"))
    return out


def from_zero_findings(tensors: pd.DataFrame) -> list[Finding]:
    """``changed-from-zero`` (info): tensors all zeros in A that changed (zero-initialised biases,
    adapters' B matrices), whose ``rel_change`` is NaN since ‖A‖ = 0."""
    rows = tensors[(tensors["norm_a"] == 0) & (tensors["diff_norm"] > 0)]
    if not len(rows):
        return []
    names = rows["name"].tolist()
    return [Finding("changed-from-zero", "info", names[0],
                    f"{len(names)} tensors are all zeros in A and changed in B (zero-initialised, "
                    f"such as biases): {capped(names)}. Their rel_change is empty (‖A‖ = 0); "
                    "their change is diff_norm = ‖B‖")]


def low_rank_findings(tensors: pd.DataFrame) -> list[Finding]:
    """``low-rank-update`` (info), one per rank: ``rank-8 update on 64 matrices``."""
    rows = tensors[tensors["update_rank"].notna()]
    sketched = int(((tensors["status"] == "changed") & tensors["shape_a"].map(
        lambda s: s is not None and len(s) == 2)).sum())
    out = []
    for rank, count in Counter(int(r) for r in rows["update_rank"]).most_common():
        names = rows.loc[rows["update_rank"] == rank, "name"].tolist()
        out.append(Finding("low-rank-update", "info", names[0],
                           f"rank-{rank} update on {count} matrices (of {sketched} changed matrices; "
                           f"B − A is rank {rank} within {LOW_RANK_TOLERANCE:.0%} of its norm): "
                           f"{capped(names, 4)}. "
                           "This is what a merged adapter (LoRA) or a low-rank edit leaves"))
    return out


def cap_findings(findings: Sequence[Finding], limit: int = MAX_PER_CODE) -> list[Finding]:
    """At most ``limit`` findings per code, the rest folded into one ``... and N more``."""
    out: list[Finding] = []
    counts = Counter(f.code for f in findings)
    seen: Counter[str] = Counter()
    for f in findings:
        seen[f.code] += 1
        if seen[f.code] <= limit:
            out.append(f)
        elif seen[f.code] == limit + 1:
            rest = counts[f.code] - limit
            out.append(Finding(f.code, f.severity, "", f"... and {rest} more {f.code} findings like the "
                               f"above (first of them: {f.where or f.message[:80]})"))
    return out
