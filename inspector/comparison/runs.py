"""Two training runs side by side: the first step where they part, and the modules that part first.

Both run files are read with :func:`inspector.watching.read_run` (the watch's Arrow file, or a
``check_step`` ``run.jsonl``). Two numbers differ beyond ``tolerance`` when
``|B − A| / max(|A|, |B|) > tolerance``; a value that is finite on one side and not on the
other always does.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from ..utils.budget import check_budget
from ..utils.findings import Finding, InspectorError
from .result import RunComparison

DEFAULT_TOLERANCE = 1e-6
RUN_MODULE_COLUMNS = ["module", "first_divergence", "max_diff", "diff_at_divergence"]


def relative_difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``|b − a| / max(|a|, |b|)`` elementwise: 0 where both are 0 or both NaN, inf where only one is finite.

    >>> relative_difference(np.array([1.0, 0.0, 2.0]), np.array([1.5, 0.0, np.nan])).tolist()
    [0.3333333333333333, 0.0, inf]
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = np.maximum(np.abs(a), np.abs(b))
        out = np.where(scale > 0, np.abs(b - a) / np.where(scale > 0, scale, 1.0), 0.0)
    fa, fb = np.isfinite(a), np.isfinite(b)
    out = np.where(fa & fb, out, np.inf)
    return np.where(~fa & ~fb & (np.isnan(a) == np.isnan(b)), 0.0, out)


def _read(run: Any) -> Any:
    from ..watching import Run, read_run

    if isinstance(run, Run):
        return run
    if not isinstance(run, (str, os.PathLike)):
        raise InspectorError(f"a run to compare is a run file path or a Run, not {type(run).__name__}")
    return read_run(run)


UNCOMPARED = ("step", "rank", "time", "step_time", "device_allocated", "device_peak", "rss", "loss_logged")
MODULE_QUANTITIES = ("grad_norm", "param_norm", "update_ratio", "nonfinite")


@dataclass(frozen=True)
class _Numbers:
    """One run's numbers of one rank, one row per step (the last row of a step): ``names`` (loss,
    grad_norm, lr_0..., logged scalars; a pyarrow string array, no Python string per name), ``values``
    (steps × names, float64) and ``logged`` (a NaN loss that was logged: not finite; one that was not
    logged is null in the file)."""

    steps: np.ndarray
    names: Any
    values: np.ndarray
    logged: np.ndarray

    def recorded(self) -> np.ndarray:
        """Per name, whether any step holds a finite value."""
        return np.isfinite(self.values).any(axis=0) if len(self.steps) else np.zeros(len(self.names), bool)

    def on(self, steps: np.ndarray, columns: np.ndarray) -> np.ndarray:
        """``values`` at ``steps`` (NaN where this run has no such step) and ``columns``, in one take."""
        out = np.full((len(steps), len(columns)), np.nan)
        where = np.searchsorted(self.steps, steps)
        have = (where < len(self.steps)) & (self.steps[np.minimum(where, len(self.steps) - 1)] == steps)
        out[have] = self.values[np.ix_(where[have], columns)]
        return out


def _names(index: pd.Index) -> Any:
    """Column names as a pyarrow string array (the steps table keeps them in Arrow: no copy, no Python
    string per name)."""
    import pyarrow as pa

    if isinstance(index.dtype, pd.StringDtype):
        return pa.array(index.array)
    return pa.array([str(c) for c in index], pa.string())


def _numbers(run: Any, rank: int) -> _Numbers:
    """Every recorded number of ``rank`` per step (loss, grad_norm, lr_0..., scale, logged scalars) as one
    float64 matrix, converted in one pass (a run of 100,000 learning rates is 100,000 columns); timings
    and memory are left out (they differ between any two runs)."""
    steps = run.steps
    logged = ~np.asarray(run.table.column("loss").is_null().to_numpy(zero_copy_only=False), dtype=bool)
    # the step and rank columns from the Arrow table (same rows): a lookup by name in a table of 100,000
    # columns would build its index's hash table, a Python string per column
    mine = np.flatnonzero(run.table.column("rank").to_numpy() == rank)
    if not len(mine):
        raise InspectorError(f"{run.path} has no steps for rank {rank}")
    at = run.table.column("step").to_numpy()[mine]
    keep = len(at) - 1 - np.unique(at[::-1], return_index=True)[1]  # the last row of each step, by step
    rows = mine[keep]
    numeric = np.fromiter((pd.api.types.is_numeric_dtype(t) or pd.api.types.is_bool_dtype(t)
                           for t in steps.dtypes), dtype=bool, count=steps.shape[1])
    columns = np.flatnonzero(numeric & ~steps.columns.isin(UNCOMPARED))
    values = steps.iloc[rows, columns].to_numpy(dtype=np.float64, na_value=np.nan)
    return _Numbers(at[keep].astype(np.int64), _names(steps.columns[columns]), values, logged[rows])


def _module_matrix(run: Any, rank: int, steps: np.ndarray, modules: list[str], column: str) -> np.ndarray:
    """Per-module ``column`` (len(steps) × len(modules)) of ``run`` at those steps and modules."""
    have_steps, values = run.matrix(column, rank)
    row = {int(s): i for i, s in enumerate(have_steps)}
    col = {m: i for i, m in enumerate(run.module_order)}
    return values[np.ix_([row[int(s)] for s in steps], [col[m] for m in modules])].astype(np.float64)


def _module_diff(ra: Any, rb: Any, rank: int, common: np.ndarray, modules: list[str]) -> np.ndarray:
    """The largest relative difference of each module's recorded numbers (gradient and parameter
    norms, update ratios, nonfinite counts) per step; a number recorded by one run only is skipped."""
    diff = np.zeros((len(common), len(modules)))
    for column in MODULE_QUANTITIES:
        check_budget()
        try:
            ma, mb = (_module_matrix(r, rank, common, modules, column) for r in (ra, rb))
        except (InspectorError, KeyError):
            continue
        if np.isfinite(ma).any() and np.isfinite(mb).any():
            diff = np.maximum(diff, relative_difference(ma, mb))
    return diff


def _quantities(na: _Numbers, nb: _Numbers) -> tuple[Any, np.ndarray, np.ndarray]:
    """The numbers compared (a pyarrow string array): loss and grad_norm, then (in A's order) every other
    number both runs record; with their columns in A and in B. Matched in Arrow, name for name."""
    import pyarrow as pa
    import pyarrow.compute as pc

    in_b = pc.fill_null(pc.index_in(na.names, value_set=nb.names), -1).to_numpy().astype(np.int64)
    first = []
    for q in ("loss", "grad_norm"):
        hit = np.flatnonzero(pc.equal(na.names, q).to_numpy(zero_copy_only=False))
        if len(hit) and in_b[hit[0]] >= 0:
            first.append(int(hit[0]))
    rec_b = nb.recorded()
    rest = (in_b >= 0) & na.recorded() & rec_b[np.maximum(in_b, 0)]
    rest[first] = False
    ca = np.concatenate([np.asarray(first, dtype=np.int64), np.flatnonzero(rest)])
    names = na.names.take(pa.array(ca))
    return names, ca, in_b[ca]


def _steps_table(union: np.ndarray, quantities: Any, a: np.ndarray, b: np.ndarray,
                 diff: np.ndarray) -> pd.DataFrame:
    """``step, q_a, q_b, q_diff, ...``: one float64 block built at once (not a column at a time), its
    column names made in Arrow (300,000 of them for two runs of 100,000 learning rates)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    block = np.stack([a, b, diff], axis=2).reshape(len(union), 3 * len(quantities))
    text, empty = quantities.cast(pa.large_string()), pa.scalar("", pa.large_string())
    parts = [pc.binary_join_element_wise(text, pa.scalar(x, pa.large_string()), empty)
             for x in ("_a", "_b", "_diff")]
    order = np.arange(3 * len(quantities)).reshape(3, -1).T.reshape(-1)  # q0_a, q0_b, q0_diff, q1_a...
    names = pa.concat_arrays(parts).take(pa.array(order))
    values = pd.DataFrame(block, columns=pd.Index(pd.arrays.ArrowStringArray(pa.chunked_array([names]))),
                          copy=False)
    # joined as two blocks: inserting a column would turn every name into a Python string
    return pd.concat([pd.DataFrame({"step": union}), values], axis=1, copy=False)


def compare_runs(a: Any, b: Any, *, tolerance: float = DEFAULT_TOLERANCE, rank: int = 0) -> RunComparison:
    """Runs ``a`` and ``b`` (paths or :class:`inspector.watching.Run`) step by step: the first step where
    any number both record (loss, gradient norm, learning rates, logged scalars, each module's norms)
    differs beyond ``tolerance``.

    Every number is converted once, as one matrix per run, so the work grows with the numbers held
    (steps × columns), not with their square: two runs of 100,000 learning rates compare in about a
    second.

    Args:
        tolerance: relative difference (``|B − A| / max(|A|, |B|)``) beyond which a number diverges;
            0 means any difference.
        rank: the rank whose numbers are compared.

    Raises:
        InspectorError: a run file is unreadable, or the runs share no step.
    """
    if not (isinstance(tolerance, (int, float)) and tolerance >= 0 and math.isfinite(tolerance)):
        raise InspectorError(f"tolerance must be a finite number of 0 or more, got {tolerance!r}")
    import pyarrow as pa

    ra, rb = _read(a), _read(b)
    check_budget()
    na, nb = _numbers(ra, rank), _numbers(rb, rank)
    check_budget()
    common = np.intersect1d(na.steps, nb.steps)
    if not len(common):
        raise InspectorError(
            f"{ra.path} and {rb.path} share no step (A: {na.steps.min()}..{na.steps.max()}, "
            f"B: {nb.steps.min()}..{nb.steps.max()}); nothing to compare"
        )
    union = np.union1d(na.steps, nb.steps)
    quantities, ca, cb = _quantities(na, nb)
    va, vb = na.on(union, ca), nb.on(union, cb)
    qdiff = relative_difference(va, vb)
    steps = _steps_table(union, quantities, va, vb, qdiff)
    check_budget()
    at_common = np.searchsorted(union, common)
    logged = (na.logged[np.searchsorted(na.steps, common)] & nb.logged[np.searchsorted(nb.steps, common)])
    out = qdiff[at_common] > tolerance
    if len(quantities) and quantities[0].as_py() == "loss":  # loss comes first when both record it
        out[:, 0] &= logged
    in_b = set(rb.module_order)
    modules = [m for m in ra.module_order if m in in_b]
    diff = _module_diff(ra, rb, rank, common, modules)
    beyond = diff > tolerance
    parted = np.flatnonzero(out.any(axis=1) | beyond.any(axis=1))
    first = int(common[parted[0]]) if len(parted) else None
    first_modules: tuple[str, ...] = ()
    first_quantities: tuple[str, ...] = ()
    first_values: list[tuple[str, float, float]] = []
    if first is not None:
        row = diff[parted[0]]
        first_modules = tuple(modules[i] for i in np.argsort(-row, kind="stable") if row[i] > tolerance)
        parts_at = np.flatnonzero(out[parted[0]])
        first_quantities = tuple(quantities.take(pa.array(parts_at)).to_pylist())
        row_u = at_common[parted[0]]
        first_values = [(q, float(va[row_u, j]), float(vb[row_u, j]))
                        for q, j in zip(first_quantities[:4], parts_at[:4], strict=False)]
    table = _module_table(modules, common, diff, beyond, first, parted)
    findings = _findings(ra, rb, na.steps, nb.steps, modules, first, first_modules, first_quantities,
                         tolerance, first_values)
    facts = {"steps_a": len(na.steps), "steps_b": len(nb.steps), "common_steps": len(common),
             "modules": len(modules), "tolerance": tolerance, "first_divergence": first,
             "quantities": len(quantities)}
    return RunComparison(ra.path, rb.path, steps, table, first, first_modules, float(tolerance),
                         tuple(findings), facts, first_quantities)


SHOWN_QUANTITIES = 8  # step-level numbers a table shows by default (loss, grad_norm, those that parted...)


def shown_step_columns(result: RunComparison, limit: int | None = SHOWN_QUANTITIES) -> tuple[list[str], int]:
    """``(columns, left_out)``: the columns of ``result.steps`` a table shows: ``step``, then for each of at
    most ``limit`` numbers (None: every one) its ``_a``, ``_b`` and ``_diff``: the loss and the gradient
    norm, those beyond the tolerance at the first divergence, then the rest in file order; ``left_out``
    counts the numbers not shown (a run of 100,000 learning rates has 300,001 columns; the JSON export
    holds every one). The command line and the Compare page show the same columns."""
    compared = result.facts.get("quantities", 0)
    order = dict.fromkeys(q for q in ("loss", "grad_norm") if f"{q}_diff" in result.steps.columns)
    order.update(dict.fromkeys(result.first_quantities))
    if limit is None or len(order) < limit:
        names = result.steps.columns[1::3] if len(result.steps.columns) > 1 else []
        for col in names:
            if limit is not None and len(order) >= limit:
                break
            order.setdefault(str(col).removesuffix("_a"), None)
    quantities = list(order)[:limit] if limit is not None else list(order)
    return ["step", *(f"{q}_{x}" for q in quantities for x in ("a", "b", "diff"))], compared - len(quantities)


def _module_table(modules: list[str], common: np.ndarray, diff: np.ndarray, beyond: np.ndarray,
                  first: int | None, parted: np.ndarray) -> pd.DataFrame:
    """Per module (model order): its first step beyond the tolerance, its largest and its first-step
    difference."""
    hit = beyond.any(axis=0) if len(common) else np.zeros(len(modules), dtype=bool)
    firsts = pd.array(np.where(hit, common[beyond.argmax(axis=0)] if len(common) else 0, 0), dtype="Int64")
    firsts[~hit] = pd.NA
    largest = diff.max(axis=0) if len(common) else np.full(len(modules), math.nan)
    at_first = diff[parted[0]] if first is not None else np.full(len(modules), math.nan)
    return pd.DataFrame(dict(zip(RUN_MODULE_COLUMNS, (modules, firsts, largest.astype(np.float64),
                                                      at_first.astype(np.float64)), strict=True)))


def _findings(ra: Any, rb: Any, sa: np.ndarray, sb: np.ndarray, modules: list[str], first: int | None,
              first_modules: tuple[str, ...], first_quantities: tuple[str, ...], tolerance: float,
              first_values: list[tuple[str, float, float]]) -> list[Finding]:
    out = []
    if first is None:
        out.append(
            Finding(
                "runs-agree",
                "info",
                "",
                f"{ra.path} and {rb.path} agree within {tolerance:g} (relative) "
                f"in every number both record (loss, gradient norms, learning rates...) at all "
                f"{len(np.intersect1d(sa, sb))} common steps",
            )
        )
    else:
        parts = [f"{'the loss' if q == 'loss' else q} is {a:.6g} in A and {b:.6g} in B"
                 for q, a, b in first_values]
        loss_text = "; ".join(parts) + ("; the loss still agrees" if "loss" not in first_quantities else "")
        loss_text = loss_text.removeprefix("; ")
        shown = ", ".join(first_modules[:5]) + (
            f" and {len(first_modules) - 5} more" if len(first_modules) > 5 else ""
        )
        out.append(
            Finding(
                "run-diverged",
                "warning",
                first_modules[0] if first_modules else (first_quantities[0] if first_quantities else "loss"),
                f"{ra.path} and {rb.path} diverge first at step {first} (beyond {tolerance:g} relative): "
                f"{loss_text}" + (f"; the numbers of {shown} part first" if first_modules else ""),
            )
        )
    only_a, only_b = np.setdiff1d(sa, sb), np.setdiff1d(sb, sa)
    if len(only_a) or len(only_b):
        out.append(
            Finding(
                "steps-missing",
                "info",
                "",
                f"{len(only_a)} steps are only in {ra.path} and {len(only_b)} "
                f"only in {rb.path}; they are shown but not compared",
            )
        )
    differ = sorted(set(ra.module_order) ^ set(rb.module_order))
    if differ:
        out.append(
            Finding(
                "modules-differ",
                "warning",
                differ[0],
                f"{len(differ)} modules are in one run only "
                f"(first: {differ[0]}); only the {len(modules)} modules of both are compared",
            )
        )
    return out
