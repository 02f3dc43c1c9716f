"""Two training runs side by side: the first step where they part, and the modules that part first.

Both run files are read with :func:`inspector.watching.read_run` (the watch's Arrow file, or a
``check_step`` ``run.jsonl``). Two numbers differ beyond ``tolerance`` when
``|B − A| / max(|A|, |B|) > tolerance``; a value that is finite on one side and not on the
other always does.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import pandas as pd

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


def _steps(run: Any, rank: int) -> pd.DataFrame:
    """Every recorded number of ``rank`` per step (loss, grad_norm, lr_0..., scale, logged scalars), and
    ``loss_logged`` (a NaN loss that was logged is not finite; one that was not logged is null in the
    file); timings and memory are left out (they differ between any two runs)."""
    logged = ~np.asarray(run.table.column("loss").is_null().to_numpy(zero_copy_only=False), dtype=bool)
    steps = run.steps.assign(loss_logged=logged)
    steps = steps[steps["rank"] == rank]
    if not len(steps):
        raise InspectorError(f"{run.path} has no steps for rank {rank}")
    numbers = [c for c in steps.columns if c not in UNCOMPARED and (
        pd.api.types.is_numeric_dtype(steps[c]) or pd.api.types.is_bool_dtype(steps[c]))]
    out = steps[["step", *numbers, "loss_logged"]].drop_duplicates("step", keep="last").copy()
    for c in numbers:
        out[c] = out[c].astype(np.float64)
    return out


def _recorded(values: pd.Series | np.ndarray) -> bool:
    return bool(np.isfinite(np.asarray(values, dtype=np.float64)).any())


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
        try:
            ma, mb = (_module_matrix(r, rank, common, modules, column) for r in (ra, rb))
        except (InspectorError, KeyError):
            continue
        if _recorded(ma) and _recorded(mb):
            diff = np.maximum(diff, relative_difference(ma, mb))
    return diff


def compare_runs(a: Any, b: Any, *, tolerance: float = DEFAULT_TOLERANCE, rank: int = 0) -> RunComparison:
    """Runs ``a`` and ``b`` (paths or :class:`inspector.watching.Run`) step by step: the first step where
    any number both record (loss, gradient norm, learning rates, logged scalars, each module's norms)
    differs beyond ``tolerance``.

    Args:
        tolerance: relative difference (``|B − A| / max(|A|, |B|)``) beyond which a number diverges;
            0 means any difference.
        rank: the rank whose numbers are compared.

    Raises:
        InspectorError: a run file is unreadable, or the runs share no step.
    """
    if not (isinstance(tolerance, (int, float)) and tolerance >= 0 and math.isfinite(tolerance)):
        raise InspectorError(f"tolerance must be a finite number of 0 or more, got {tolerance!r}")
    ra, rb = _read(a), _read(b)
    sa, sb = _steps(ra, rank), _steps(rb, rank)
    steps = sa.merge(sb, on="step", how="outer", suffixes=("_a", "_b")).sort_values("step", ignore_index=True)
    common = np.array(sorted(set(sa["step"]) & set(sb["step"])), dtype=np.int64)
    if not len(common):
        raise InspectorError(
            f"{ra.path} and {rb.path} share no step (A: {sa['step'].min()}..{sa['step'].max()}, "
            f"B: {sb['step'].min()}..{sb['step'].max()}); nothing to compare"
        )
    both = [c for c in sa.columns if c in sb.columns and c not in ("step", "loss_logged")]
    quantities = ["loss", "grad_norm"] + [c for c in both if c not in ("loss", "grad_norm")
                                          and _recorded(sa[c]) and _recorded(sb[c])]
    for q in quantities:
        steps[f"{q}_diff"] = relative_difference(steps[f"{q}_a"].to_numpy(), steps[f"{q}_b"].to_numpy())
    logged = (
        steps.set_index("step")[["loss_logged_a", "loss_logged_b"]].fillna(False).astype(bool).all(axis=1)
    )
    steps = steps[["step"] + [f"{q}_{x}" for q in quantities for x in ("a", "b", "diff")]]
    by_step = steps.set_index("step").loc[common]
    out = np.zeros((len(common), len(quantities)), dtype=bool)
    for j, q in enumerate(quantities):
        known = logged.loc[common].to_numpy(dtype=bool) if q == "loss" else np.ones(len(common), bool)
        out[:, j] = known & (by_step[f"{q}_diff"].to_numpy() > tolerance)
    in_b = set(rb.module_order)
    modules = [m for m in ra.module_order if m in in_b]
    diff = _module_diff(ra, rb, rank, common, modules)
    beyond = diff > tolerance
    parted = np.flatnonzero(out.any(axis=1) | beyond.any(axis=1))
    first = int(common[parted[0]]) if len(parted) else None
    first_modules: tuple[str, ...] = ()
    first_quantities: tuple[str, ...] = ()
    if first is not None:
        row = diff[parted[0]]
        first_modules = tuple(modules[i] for i in np.argsort(-row, kind="stable") if row[i] > tolerance)
        first_quantities = tuple(q for j, q in enumerate(quantities) if out[parted[0], j])
    table = _module_table(modules, common, diff, beyond, first, parted)
    findings = _findings(ra, rb, sa, sb, modules, first, first_modules, first_quantities, tolerance, steps)
    facts = {"steps_a": len(sa), "steps_b": len(sb), "common_steps": len(common), "modules": len(modules),
             "tolerance": tolerance, "first_divergence": first, "quantities": len(quantities)}
    return RunComparison(ra.path, rb.path, steps, table, first, first_modules, float(tolerance),
                         tuple(findings), facts, first_quantities)


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


def _findings(ra: Any, rb: Any, sa: pd.DataFrame, sb: pd.DataFrame, modules: list[str], first: int | None,
              first_modules: tuple[str, ...], first_quantities: tuple[str, ...], tolerance: float,
              steps: pd.DataFrame) -> list[Finding]:
    out = []
    if first is None:
        out.append(
            Finding(
                "runs-agree",
                "info",
                "",
                f"{ra.path} and {rb.path} agree within {tolerance:g} (relative) "
                f"in every number both record (loss, gradient norms, learning rates...) at all "
                f"{len(set(sa['step']) & set(sb['step']))} common steps",
            )
        )
    else:
        at = steps.set_index("step").loc[first]
        parts = [f"{'the loss' if q == 'loss' else q} is {at[q + '_a']:.6g} in A and {at[q + '_b']:.6g} in B"
                 for q in first_quantities[:4]]
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
    only_a, only_b = set(sa["step"]) - set(sb["step"]), set(sb["step"]) - set(sa["step"])
    if only_a or only_b:
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
