"""Every rank's numbers of one ``check_step`` call as columns, and the findings read from them.

The tests that decide whether a tensor has something to say (hashes that differ between ranks
holding the same piece, NaN/Inf counts, a plain parameter's gradient norm that differs between
ranks) run over all tensors at once; a tensor's JSON row is built only where one of them
fires, and the whole record only when it is asked for (written, or read from
:attr:`~.check.StepCheck.record`). The findings are those :func:`.findings.step_findings`
finds in that record.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from ..findings import Finding
from .findings import IMBALANCE, far_off, imbalance, row_findings, spread
from .plan import Plan
from .record import build_record


@dataclass
class Gathered:
    """What the all_gather of one call brought: ``per_tensor`` (world, n, 8) float64, ``per_rank``
    (world, 9), ``hashes`` (world, n, 2) int64, and each gradient's holders (n,)."""

    plan: Plan
    per_tensor: torch.Tensor
    per_rank: torch.Tensor
    hashes: torch.Tensor
    factors: torch.Tensor
    step: int
    world: int
    backend: str
    note: str
    _record: dict[str, Any] | None = field(default=None, repr=False)

    def _static(self, index: list[int]) -> list[dict[str, Any]]:
        plan = self.plan
        return [{**plan.static[i], "requires_grad": bool(plan.tensors[i][2].requires_grad) if plan.is_param[i]
                 else False} for i in index]

    def rows(self, index: list[int]) -> list[dict[str, Any]]:
        """The record's rows of the tensors at ``index`` (the same dicts :meth:`record` holds)."""
        if self._record is not None:
            return [self._record["tensors"][i] for i in index]
        pick = torch.tensor(index, dtype=torch.long)
        return build_record(self._static(index), self.factors[pick].tolist(), self.per_tensor[:, pick],
                            self.per_rank, self.hashes[:, pick], self.step, self.world, self.backend,
                            self.note)["tensors"]

    def record(self) -> dict[str, Any]:
        """The JSON-ready step record (built once, on first use)."""
        if self._record is None:
            self._record = build_record(self._static(list(range(len(self.plan.tensors)))), self.factors.tolist(),
                                        self.per_tensor, self.per_rank, self.hashes, self.step, self.world,
                                        self.backend, self.note)
        return self._record


def _drifting(keys: torch.Tensor, hashes: torch.Tensor) -> torch.Tensor:
    """Tensors where two ranks with the same replica key (>= 0) hold different hashes: ranks
    sorted by key, so the ranks of one key are neighbours and any difference shows between two."""
    order = torch.argsort(keys, dim=0, stable=True)
    k = keys.gather(0, order)
    h0, h1 = hashes[:, :, 0].gather(0, order), hashes[:, :, 1].gather(0, order)
    same = (k[1:] == k[:-1]) & (k[1:] >= 0)
    return (same & ((h0[1:] != h0[:-1]) | (h1[1:] != h1[:-1]))).any(dim=0)


def _candidates(g: Gathered) -> list[int]:
    """Tensors whose row may hold a finding (a superset of those that do)."""
    p = g.per_tensor
    n = p.shape[1]
    if n == 0:
        return []
    found = (p[:, :, 6:8] > 0).any(dim=2).any(dim=0) | (p[:, :, 1:3] > 0).any(dim=2).any(dim=0)
    if g.world > 1:
        has = (p[:, :, 4] > 0).any(dim=0)
        sq = p[:, :, 0]
        found |= _drifting(p[:, :, 5], g.hashes)
        found |= g.plan.columns["plain_param"] & has & ~(sq.amax(dim=0) == sq.amin(dim=0))
    return torch.nonzero(found).flatten().tolist()


def _rms(g: Gathered) -> dict[int, float]:
    """Each rank's gradient RMS per element over its finite local pieces."""
    p = g.per_tensor
    sq, numel = p[:, :, 0], p[:, :, 3]
    valid = (p[:, :, 4] > 0).any(dim=0).unsqueeze(0) & torch.isfinite(sq) & (sq >= 0)
    total = torch.where(valid, sq, 0.0).sum(dim=1).tolist()
    count = torch.where(valid, numel, 0.0).sum(dim=1).tolist()
    return {r: math.sqrt(s / c) for r, (s, c) in enumerate(zip(total, count, strict=True)) if c}


def _uneven(g: Gathered) -> bool:
    """Whether :func:`.findings.imbalance` has something to say."""
    sharded = g.plan.columns["sharded"]
    if g.world < 2 or not bool(sharded.any()):
        return False
    totals = g.per_tensor[:, :, 3][:, sharded].sum(dim=1)
    mean = float(totals.mean())
    return mean != 0 and (float(totals.max()) - mean) / mean > IMBALANCE


def column_findings(g: Gathered, far_factor: float = 10.0) -> list[Finding]:
    """The findings :func:`.findings.step_findings` finds in ``g.record()``, in the same order,
    with Python work only for the tensors where something may be wrong."""
    findings: list[Finding] = []
    gradients: list[Finding] = []
    for row in g.rows(_candidates(g)):
        row_findings(row, g.step, g.world > 1, findings, gradients)
    findings += gradients if len(gradients) < 2 else [spread(g.record(), gradients)]
    findings += far_off(_rms(g), far_factor)
    if _uneven(g):
        findings += imbalance(g.record())
    return findings
