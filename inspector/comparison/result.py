"""What a comparison returns: frozen results with their tables and findings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ..utils.findings import Finding

TENSOR_COLUMNS = [
    "name",
    "name_b",
    "status",
    "module",
    "shape_a",
    "shape_b",
    "dtype_a",
    "dtype_b",
    "device_a",
    "device_b",
    "numel",
    "trainable",
    "bitwise_equal",
    "max_abs",
    "rel_change",
    "diff_norm",
    "norm_a",
    "nonfinite_a",
    "nonfinite_b",
    "exact_cast",
    "update_rank",
]
MODULE_COLUMNS = [
    "module",
    "depth",
    "tensors",
    "changed",
    "numel",
    "diff_norm",
    "norm_a",
    "rel_change",
    "max_abs",
]
STATUSES = (
    "equal",
    "changed",
    "dtype-changed",
    "shape-changed",
    "missing",
    "extra",
    "no-values",
    "stored-once",
)


@dataclass(frozen=True)
class WeightComparison:
    """What changed from A to B, tensor by tensor and module by module.

    Attributes:
        a, b: labels of the two sides (a model's name or a file name); ``a_kind``/``b_kind`` say
            what each is (``"model"``, ``"safetensors"``, ``"torch file"``, ``"distributed checkpoint"``...).
        tensors: one row per tensor (``TENSOR_COLUMNS``), A's order then B's extras. ``status`` is one
            of ``STATUSES`` (``stored-once``: a tied name B's file holds under the tie's other name, as
            ``safetensors`` saves a tie, so not missing); ``name_b`` is B's name (differs where B
            renamed it); ``max_abs`` is max |B−A|, ``rel_change`` ‖B−A‖/‖A‖, both NaN where values were
            not compared (``rel_change`` also where A is all zeros); ``update_rank`` the rank of a
            changed matrix's B−A where it is low, else NA.
        modules: one row per module prefix of A's names, in model order (``MODULE_COLUMNS``): the
            compared tensors below it, how many changed, and the norms summed over them.
        findings: ``unchanged-tensor`` (one, grouped), ``unchanged-expected``, ``tie-broken``,
            ``tie-added``, ``tie-stored-once``, ``renamed``, ``missing``, ``extra``, ``shape-changed``,
            ``dtype-changed``, ``nonfinite``, ``changed-from-zero``, ``low-rank-update``...; at most 10
            of one code.
        renamed: (name in A, name in B) pairs joined by a prefix rule or by equal values.
        facts: counts (tensors on each side, compared, changed, equal, bytes read, low_rank) and
            ``summary``, one line: ``26 of 28 tensors changed; 2 unchanged: wte, wpe``.
    """

    a: str
    b: str
    a_kind: str
    b_kind: str
    tensors: pd.DataFrame = field(repr=False)
    modules: pd.DataFrame = field(repr=False)
    findings: tuple[Finding, ...] = ()
    renamed: tuple[tuple[str, str], ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)

    def status_of(self, name: str) -> str:
        """The ``status`` of tensor ``name`` (A's name, or B's for an extra)."""
        rows = self.tensors[(self.tensors["name"] == name) | (self.tensors["name_b"] == name)]
        if not len(rows):
            raise KeyError(name)
        return str(rows["status"].iloc[0])

    def codes(self) -> list[str]:
        """The finding codes, in order (handy in tests and scripts)."""
        return [f.code for f in self.findings]


@dataclass(frozen=True)
class RunComparison:
    """Two training runs side by side.

    Attributes:
        a, b: the run files' names.
        steps: one row per step either run has: ``step``, then each number both runs record, for A and B
            and their relative difference (``loss_a, loss_b, loss_diff, grad_norm_a, grad_norm_b,
            grad_norm_diff``, then ``lr_0_a, lr_0_b, lr_0_diff``, the scale, logged scalars...).
        modules: one row per module of both runs, in model order: ``module, first_divergence`` (its first
            step where one of its numbers, gradient or parameter norm, update ratio or nonfinite count, is
            beyond the tolerance, or None), ``max_diff`` (its largest relative difference) and
            ``diff_at_divergence`` (at the runs' first divergence).
        first_divergence: the first step where any number both runs record (loss, learning rate, a
            module's gradient norm...) differs by more than ``tolerance`` (relative; 0: any difference),
            or None.
        first_modules: the modules beyond the tolerance at that step, largest difference first.
        tolerance: the relative tolerance used.
        findings: ``run-diverged`` (or ``runs-agree``), ``steps-missing``, ``modules-differ``.
        first_quantities: the step-level numbers (``loss``, ``lr_0``...) beyond the tolerance at that step.
    """

    a: str
    b: str
    steps: pd.DataFrame = field(repr=False)
    modules: pd.DataFrame = field(repr=False)
    first_divergence: int | None
    first_modules: tuple[str, ...]
    tolerance: float
    findings: tuple[Finding, ...] = ()
    facts: Mapping[str, Any] = field(default_factory=dict)
    first_quantities: tuple[str, ...] = ()

    def codes(self) -> list[str]:
        return [f.code for f in self.findings]
