"""Gradient rows: one per parameter, and per module prefix the sums of everything below it and of
what it holds itself, from the norms and counts :mod:`.gradients` read in one pass."""

from __future__ import annotations

import math
from typing import Any

import torch

from ._tables import ROOT, STATES, label

Params = list[tuple[str, torch.Tensor]]
Gradients = list[torch.Tensor | None]
_STATE_COLUMN = {state: 5 + k for k, state in enumerate(STATES)}  # in the module sums below


def _module_prefixes(name: str) -> list[str]:
    parts = name.split(".")[:-1]
    return [".".join(parts[:k]) for k in range(len(parts) + 1)]


def rows_and_sums(params: Params, shared: dict[int, list[str]], gradients: Gradients, norms: list[float],
          counts: dict[int, tuple[int, int]]) -> tuple[list[tuple], dict[str, list], dict[str, list]]:
    """Rows per parameter, and per module prefix the sums of everything below it and of what it holds.

    Returns:
        (parameter rows, module -> [sum of squares, nan, inf, numel, params, states x4, grads],
        module -> [sum of squares of what it holds itself, grads]).
    """
    prows: list[tuple] = []
    modules: dict[str, list] = {}
    own: dict[str, list] = {}
    chains: dict[str, list[list]] = {}  # holder -> the sums of itself and of every parent, root first
    labels: dict[Any, str] = {}
    for i, (name, p) in enumerate(params):
        g = gradients[i]
        norm = norms[i]
        nan, inf = (0, 0) if g is None else counts.get(i, (0, 0))
        rg = p.requires_grad
        if g is None:
            state = "none" if rg else "frozen"
        else:
            state = "frozen" if not rg else "nonfinite" if nan or inf else "ok"
        numel = p.numel()
        dt, dev = p.dtype, (p.device if g is None else g.device)
        prows.append((name, norm, state, nan, inf, numel, labels.get(dt) or label(labels, dt),
                      labels.get(dev) or label(labels, dev), rg))
        has = g is not None
        sq = norm * norm if has else 0.0
        aliases = shared.get(id(p))
        holders = (name.rpartition(".")[0],) if aliases is None else \
            tuple(dict.fromkeys(a.rpartition(".")[0] for a in aliases))
        for holder in holders:
            held = own.get(holder)
            if held is None:
                held = own[holder] = [0.0, 0]
                chains[holder] = [modules.setdefault(prefix, [0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0])
                                  for prefix in dict.fromkeys(_module_prefixes(holder + ".x"))]
            held[0] += sq
            held[1] += has
        # a tied parameter counts once in every module above any of its holders
        sums = chains[holders[0]] if len(holders) == 1 else \
            list({id(acc): acc for holder in holders for acc in chains[holder]}.values())
        col = _STATE_COLUMN[state]
        for acc in sums:
            acc[0] += sq
            acc[1] += nan
            acc[2] += inf
            acc[3] += numel
            acc[4] += 1
            acc[col] += 1
            acc[9] += has
    return prows, modules, own


def module_rows(modules: dict[str, list], own: dict[str, list]) -> list[tuple]:
    """One row per module prefix, in ``MODULE_NORM_COLUMNS`` order; the model itself first."""
    mrows = []
    for prefix, (sq, nan, inf, numel, count, ok, none, frozen, nonfinite, with_grad) in modules.items():
        state = "nonfinite" if nonfinite else "ok" if ok else "none" if none else "frozen"
        held = own.get(prefix)
        mrows.append((prefix if prefix else ROOT, math.sqrt(sq) if with_grad else math.nan, state, nan, inf,
                      numel, count, ok, none, frozen, nonfinite, 0 if not prefix else prefix.count(".") + 1,
                      held is not None,
                      math.sqrt(held[0]) if held is not None and held[1] else math.nan))
    return mrows
