"""Pairing the names of two sides: the same name, or a prefix change (``model.``,
``_orig_mod.``, ``module.``).

A prefix rule ``(old, new)`` maps ``old + rest`` in A to ``new + rest`` in B. Rules are read off
the names that only one side has (their longest common dotted ending, two components at least),
most frequent first, and
a pair is kept only when both tensors have one shape and dtype; the values are compared later.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .sources import Meta


@dataclass(frozen=True)
class Pairing:
    """``pairs``: (name in A, name in B) in A's order; ``rules``: the prefix rules used, with how many
    names each paired; ``missing``: names only in A; ``extra``: names only in B."""

    pairs: tuple[tuple[str, str], ...]
    rules: tuple[tuple[str, str, int], ...]
    missing: tuple[str, ...]
    extra: tuple[str, ...]


def _split_prefix(a: str, b: str) -> tuple[str, str] | None:
    """The prefixes before the longest common dotted ending of ``a`` and ``b`` (None when they share
    fewer than two trailing components: ``weight`` alone says nothing about where a tensor went)."""
    pa, pb = a.split("."), b.split(".")
    n = 0
    while n < min(len(pa), len(pb)) and pa[-1 - n] == pb[-1 - n]:
        n += 1
    if n < 2:
        return None
    old, new = ".".join(pa[:-n]), ".".join(pb[:-n])
    return (old + "." if old else "", new + "." if new else "")


def _candidate_rules(missing: Sequence[str], extra: Sequence[str], a: Mapping[str, Meta],
                     b: Mapping[str, Meta]) -> Counter[tuple[str, str]]:
    by_key: dict[tuple, list[str]] = {}
    for name in extra:
        by_key.setdefault((name.rsplit(".", 1)[-1], b[name].shape), []).append(name)
    rules: Counter[tuple[str, str]] = Counter()
    for name in missing:
        for other in by_key.get((name.rsplit(".", 1)[-1], a[name].shape), [])[:64]:
            rule = _split_prefix(name, other)
            if rule is not None and rule[0] != rule[1]:
                rules[rule] += 1
    return rules


def pair_names(a: Mapping[str, Meta], b: Mapping[str, Meta]) -> Pairing:
    """Pair every name of ``a`` with one of ``b``: the same name first, then by prefix rules.

    >>> from torch import float32
    >>> m = Meta((2,), float32, "cpu")
    >>> p = pair_names({"w": m, "h.0.w": m}, {"module.w": m, "module.h.0.w": m})
    >>> p.pairs, p.rules
    ((('w', 'module.w'), ('h.0.w', 'module.h.0.w')), (('', 'module.', 2),))
    """
    mapping = {n: n for n in a if n in b}
    missing = [n for n in a if n not in b]
    extra = set(b) - set(a)
    used_rules = []
    for (old, new), _ in _candidate_rules(missing, sorted(extra), a, b).most_common():
        count = 0
        for name in [n for n in missing if n not in mapping and n.startswith(old)]:
            target = new + name[len(old):]
            if target in extra and b[target].shape == a[name].shape:
                mapping[name] = target
                extra.discard(target)
                count += 1
        if count:
            used_rules.append((old, new, count))
    pairs = tuple((n, mapping[n]) for n in a if n in mapping)
    return Pairing(pairs, tuple(used_rules), tuple(n for n in a if n not in mapping),
                   tuple(n for n in b if n in extra))
