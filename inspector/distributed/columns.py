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

import numpy as np
import torch

from ..runfiles.record import CheckRecord, build_record
from ..utils.findings import Finding
from .findings import IMBALANCE, far_off, imbalance, row_findings, spread
from .plan import Plan


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
    _record: CheckRecord | None = field(default=None, repr=False)

    def _static(self, index: list[int]) -> list[dict[str, Any]]:
        plan = self.plan
        return [{**plan.static[i], "requires_grad": bool(plan.tensors[i][2].requires_grad) if plan.is_param[i]
                 else False} for i in index]

    def rows(self, index: list[int]) -> list[dict[str, Any]]:
        """The JSON rows of the tensors at ``index`` (those of :meth:`record`)."""
        if self._record is not None:
            return [self._record.tensors[i].to_json() for i in index]
        pick = torch.tensor(index, dtype=torch.long)
        return [t.to_json() for t in build_record(
            self._static(index), self.factors[pick].tolist(), self.per_tensor[:, pick], self.per_rank,
            self.hashes[:, pick], self.step, self.world, self.backend, self.note).tensors]

    def record(self) -> dict[str, Any]:
        """The step record without findings, as JSON (:meth:`check`)."""
        return self.check().to_json()

    def check(self) -> CheckRecord:
        """The step record, without findings (built once, on first use)."""
        if self._record is None:
            self._record = build_record(
                self._static(list(range(len(self.plan.tensors)))),
                self.factors.tolist(),
                self.per_tensor,
                self.per_rank,
                self.hashes,
                self.step,
                self.world,
                self.backend,
                self.note,
            )
        return self._record


def _drifting(keys: np.ndarray, hashes: np.ndarray) -> np.ndarray:
    """Tensors where two ranks with the same replica key (>= 0) hold different hashes: ranks
    sorted by key, so the ranks of one key are neighbours and any difference shows between two."""
    order = np.argsort(keys, axis=0, kind="stable")
    k = np.take_along_axis(keys, order, axis=0)
    h0 = np.take_along_axis(hashes[:, :, 0], order, axis=0)
    h1 = np.take_along_axis(hashes[:, :, 1], order, axis=0)
    same = (k[1:] == k[:-1]) & (k[1:] >= 0)
    return (same & ((h0[1:] != h0[:-1]) | (h1[1:] != h1[:-1]))).any(axis=0)


def _candidates(g: Gathered, p: np.ndarray) -> list[int]:
    """Tensors whose row may hold a finding (a superset of those that do)."""
    if p.shape[1] == 0:
        return []
    found = (p[:, :, 6:8] > 0).any(axis=(0, 2)) | (p[:, :, 1:3] > 0).any(axis=(0, 2))
    if g.world > 1:
        has = (p[:, :, 4] > 0).any(axis=0)
        sq = p[:, :, 0]
        found |= _drifting(p[:, :, 5], g.hashes.numpy())
        with np.errstate(invalid="ignore"):
            found |= g.plan.columns["plain_param"].numpy() & has & ~(sq.max(axis=0) == sq.min(axis=0))
    return np.flatnonzero(found).tolist()


def _rms(p: np.ndarray) -> dict[int, float]:
    """Each rank's gradient RMS per element over its finite local pieces."""
    sq, numel = p[:, :, 0], p[:, :, 3]
    with np.errstate(invalid="ignore"):
        has: np.ndarray = np.asarray((p[:, :, 4] > 0).any(axis=0))
        valid = has[None, :] & np.isfinite(sq) & (sq >= 0)
    total = np.where(valid, sq, 0.0).sum(axis=1).tolist()
    count = np.where(valid, numel, 0.0).sum(axis=1).tolist()
    return {r: math.sqrt(s / c) for r, (s, c) in enumerate(zip(total, count, strict=True)) if c}


def _uneven(g: Gathered, p: np.ndarray) -> bool:
    """Whether :func:`.findings.imbalance` has something to say."""
    sharded = g.plan.columns["sharded"].numpy()
    if g.world < 2 or not sharded.any():
        return False
    totals = p[:, sharded, 3].sum(axis=1)
    mean = float(totals.mean())
    return mean != 0 and (float(totals.max()) - mean) / mean > IMBALANCE


def column_findings(g: Gathered, far_factor: float = 10.0) -> list[Finding]:
    """The findings :func:`.findings.step_findings` finds in ``g.record()``, in the same order,
    with Python work only for the tensors where something may be wrong."""
    findings: list[Finding] = []
    gradients: list[Finding] = []
    p = g.per_tensor.numpy()
    for row in g.rows(_candidates(g, p)):
        row_findings(row, g.step, g.world > 1, findings, gradients)
    findings += gradients if len(gradients) < 2 else [spread(g.record(), gradients)]
    findings += far_off(_rms(p), far_factor)
    if _uneven(g, p):
        findings += imbalance(g.record())
    return findings
