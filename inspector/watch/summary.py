"""Run files reduced for display: a module × step grid of bounded size, findings once each."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .run import Run, StepFinding


@dataclass(frozen=True)
class Heatmap:
    """A per-module column of a run as a ``(len(modules), len(steps))`` grid, max-pooled.

    ``steps[j]`` is the first step of column ``j`` (``steps_per_column`` steps each);
    ``modules[i]`` names row ``i`` (``"a … b"`` when several modules share it).
    """

    column: str
    rank: int
    steps: np.ndarray
    modules: tuple[str, ...]
    values: np.ndarray
    steps_per_column: int
    modules_per_row: int


def _pool(values: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Max over consecutive blocks of ``size`` along ``axis`` (NaN only where a block is all NaN)."""
    n = values.shape[axis]
    blocks = -(-n // size)
    pad = blocks * size - n
    if pad:
        shape = list(values.shape)
        shape[axis] = pad
        values = np.concatenate([values, np.full(shape, np.nan, dtype=values.dtype)], axis=axis)
    shape = list(values.shape)
    shape[axis:axis + 1] = [blocks, size]
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN blocks stay NaN
        return np.nanmax(values.reshape(shape), axis=axis + 1)


def heatmap(run: Run, column: str = "grad_norm", rank: int = 0, max_steps: int = 400,
            max_modules: int = 300) -> Heatmap:
    """The grid of ``column`` for ``rank``, at most ``max_modules`` × ``max_steps`` cells
    (max-pooled so a spike in one step or one module always shows).

    >>> import tempfile, pathlib
    >>> from inspector.watch import read_run, synthetic_run
    >>> p = pathlib.Path(tempfile.mkdtemp()) / "r.inspect"
    >>> _ = synthetic_run(p, steps=1000, modules=10)
    >>> h = heatmap(read_run(p), max_steps=100)
    >>> h.values.shape, h.steps_per_column
    ((10, 100), 10)
    """
    steps, grid = run.matrix(column, rank)  # (steps, modules)
    names = run.module_order
    per_col = max(1, -(-len(steps) // max_steps))
    per_row = max(1, -(-len(names) // max_modules))
    pooled = _pool(_pool(grid, per_col, 0), per_row, 1) if grid.size else grid
    labels = tuple(names[i] if per_row == 1 or i + 1 >= len(names)
                   else f"{names[i]} … {names[min(i + per_row, len(names)) - 1]}"
                   for i in range(0, len(names), per_row))
    return Heatmap(column, rank, steps[::per_col], labels, pooled.T, per_col, per_row)


def first_findings(run: Run) -> list[StepFinding]:
    """Each (code, where, rank) once: the step it first appeared."""
    seen: set[tuple[str, str, int | None]] = set()
    out = []
    for f in sorted(run.findings, key=lambda f: f.step):
        key = (f.code, f.where, f.rank)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out
