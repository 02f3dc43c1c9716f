"""Figures of a training run over steps: a module × step heatmap of gradient norms; the loss and
global norm lines and the findings timeline are in :mod:`.training_steps`.

The heatmap stays small whatever the run's length: it keeps at most ``max_rows`` × ``max_cols``
cells (each cell the largest norm of the modules and steps it covers, so a spike never averages
away).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ..utils.escaping import escaped_figure, plot_text
from ..utils.labels import module_label

# The figures along the steps (lines, findings timeline) live in training_steps.py; their names stay
# importable from here.
from .training_steps import MAX_LINE_POINTS as MAX_LINE_POINTS
from .training_steps import envelope as envelope
from .training_steps import findings_timeline as findings_timeline
from .training_steps import loss_norm_figure as loss_norm_figure
from .training_steps import step_axis

MAX_ROWS, MAX_COLS = 120, 300
BLOCK_CELLS = 1 << 22  # module values binned at a time by run_norm_grid (16 MiB of float32)


@dataclass(frozen=True)
class NormGrid:
    """Module × step norms, binned: ``values[r, c]`` is the largest finite norm of the modules of
    row ``r`` at the steps of column ``c`` (NaN: none recorded there); ``nonfinite[r, c]`` says one
    of them was NaN or Inf.

    ``labels``: one per row (the module, or the first of the row's modules and how many more);
    ``steps``: the first step of each column; ``rows_per_bin`` modules and ``steps_per_bin``
    recorded steps make one cell.
    """

    labels: list[str]
    steps: np.ndarray
    values: np.ndarray
    nonfinite: np.ndarray
    rows_per_bin: int
    steps_per_bin: int
    modules: int
    step_count: int
    names: tuple[str, ...] = ()  # every module, in row order (``rows_per_bin`` of them per row)

    def cell_of(self, module: str, step: int) -> tuple[int, int] | None:
        """The (row, column) of ``module`` at ``step``, or None when the module has no row."""
        if module not in self.names or not len(self.steps):
            return None
        col = max(0, int(np.searchsorted(self.steps, step, side="right")) - 1)
        return self.names.index(module) // self.rows_per_bin, col


def _codes(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Codes in first-appearance order (categoricals keep their categories' order) and the uniques."""
    if isinstance(values.dtype, pd.CategoricalDtype):
        cats, codes = values.cat.categories, values.cat.codes.to_numpy()
        used = np.flatnonzero(
            np.bincount(codes if codes.min() >= 0 else codes[codes >= 0], minlength=len(cats))
        )
        if len(used) == len(cats):
            return codes, np.asarray(cats)
        remap = np.full(len(cats), -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        return remap[codes], np.asarray(cats[used])
    codes, uniques = pd.factorize(values, sort=False)
    return codes, np.asarray(uniques)


def _sorted_codes(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Codes in ascending order of the values (steps), and the sorted uniques."""
    v = values.to_numpy()
    if v.dtype.kind in "iu" and v.size:
        lo, hi = int(v.min()), int(v.max())
        if hi - lo <= 4 * v.size:  # dense enough: counting beats hashing
            offset = v - lo
            seen = np.bincount(offset, minlength=hi - lo + 1) > 0
            if seen.all():
                return offset, np.arange(lo, hi + 1)
            return (np.cumsum(seen) - 1)[offset], np.flatnonzero(seen) + lo
    codes, uniques = pd.factorize(values, sort=False)
    order = np.argsort(uniques, kind="stable")
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = np.arange(len(order))
    return ranks[codes], np.asarray(uniques)[order]


def _bin_labels(names: np.ndarray, per_bin: int) -> list[str]:
    labels = []
    for start in range(0, len(names), per_bin):
        chunk = names[start:start + per_bin]
        labels.append(str(chunk[0]) if len(chunk) == 1 else f"{chunk[0]} (+{len(chunk) - 1})")
    return labels


def _reduce(dense: np.ndarray, rb: int, cb: int, ufunc: np.ufunc, fill: float | bool) -> np.ndarray:
    """``dense`` in blocks of ``rb`` rows × ``cb`` columns, each block reduced with ``ufunc``
    (``fill`` pads the last column block). Rows first, whole rows at a time: on a long run
    (steps × modules) that is one vector operation per step, with no copy of the array."""
    rows, cols = dense.shape
    full = rows - rows % rb
    out = ufunc.reduce(dense[:full].reshape(full // rb, rb, cols), axis=1)
    if full < rows:
        out = np.concatenate([out, ufunc.reduce(dense[full:], axis=0, keepdims=True)])
    if -cols % cb:
        out = np.pad(out, ((0, 0), (0, -cols % cb)), constant_values=fill)
    return ufunc.reduce(out.reshape(out.shape[0], out.shape[1] // cb, cb), axis=2)  # 0 modules: 0 columns


def norm_grid(modules: pd.DataFrame, value: str = "grad_norm", *, max_rows: int = MAX_ROWS,
              max_cols: int = MAX_COLS) -> NormGrid:
    """Bin a long table (``step``, ``module``, ``value`` columns; one row per module and step) into
    at most ``max_rows`` × ``max_cols`` cells.

    Modules keep their order of first appearance (execution or registration order); adjacent
    modules share a row and adjacent recorded steps a column; each cell holds the largest finite
    value it covers.

    >>> long = pd.DataFrame({"step": [0, 0, 1, 1], "module": ["a", "b", "a", "b"],
    ...                      "grad_norm": [1.0, 4.0, 2.0, float("nan")]})
    >>> g = norm_grid(long, max_rows=1, max_cols=1)
    >>> g.labels, g.values.tolist(), g.nonfinite.tolist()
    (['a (+1)'], [[4.0]], [[True]])
    """
    rows, names = _codes(modules["module"])
    cols, steps = _sorted_codes(modules["step"])
    n_rows, n_cols = len(names), len(steps)
    raw = pd.to_numeric(modules[value], errors="coerce").to_numpy(dtype=np.float32, na_value=np.nan)
    flat = cols * n_rows + rows  # a (step, module) layout: a run file written step by step fills it in order
    if len(flat) == n_rows * n_cols and (flat == np.arange(len(flat))).all():
        dense, recorded_nan = raw.reshape(n_cols, n_rows), np.isnan(raw).reshape(n_cols, n_rows)
    else:
        dense = np.full(n_cols * n_rows, np.nan, dtype=np.float32)
        dense[flat] = raw
        written = np.zeros(n_cols * n_rows, dtype=bool)
        written[flat] = np.isnan(raw)
        dense, recorded_nan = dense.reshape(n_cols, n_rows), written.reshape(n_cols, n_rows)
    return bin_matrix(steps, dense, names, nonfinite=recorded_nan, max_rows=max_rows, max_cols=max_cols)


def bin_matrix(
    steps: np.ndarray,
    values: np.ndarray,
    modules: Sequence[str] | np.ndarray,
    *,
    nonfinite: np.ndarray | None = None,
    max_rows: int = MAX_ROWS,
    max_cols: int = MAX_COLS,
) -> NormGrid:
    """Bin a steps × modules array (``Run.matrix``) into at most ``max_rows`` × ``max_cols`` cells.

    ``steps`` label the rows of ``values`` (ascending; a run's order); NaN in ``values`` is a
    value not taken, unless ``nonfinite`` (same shape) marks it as a recorded NaN; Inf is always
    not finite. Each cell holds the largest finite value of its modules and steps.
    """
    n_cols, n_rows = values.shape
    rb, cb = _per_bin(n_rows, n_cols, max_rows, max_cols)
    out, marks = _binned(values, nonfinite, rb, cb)
    return _grid(modules, np.asarray(steps)[::cb], out, marks, rb, cb, n_cols)


def _per_bin(n_rows: int, n_cols: int, max_rows: int, max_cols: int) -> tuple[int, int]:
    """Modules per row and steps per column of the grid of ``n_rows`` modules and ``n_cols`` steps."""
    return max(1, math.ceil(n_rows / max(1, max_rows))), max(1, math.ceil(n_cols / max(1, max_cols)))


def _binned(values: np.ndarray, nonfinite: np.ndarray | None, rb: int,
            cb: int) -> tuple[np.ndarray, np.ndarray]:
    """``(values, marks)`` of :class:`NormGrid` for a steps × modules array, ``rb`` modules and ``cb``
    steps a cell: a block of rows that starts at a multiple of ``cb`` gives the same columns as in the
    whole array."""
    if np.isfinite(values).all():  # the usual run: no copy, nothing to mark
        out = _reduce(values, cb, rb, np.maximum, -np.inf).T.astype(np.float64)
        return out, np.zeros(out.shape, dtype=bool)
    bad = np.isinf(values)
    if nonfinite is not None:
        bad |= nonfinite & np.isnan(values)
    dense = np.where(
        np.isfinite(values), values, -np.inf
    )  # -inf: nothing finite, so np.maximum needs no NaN check
    out = _reduce(dense, cb, rb, np.maximum, -np.inf).T.astype(np.float64)
    out[out == -np.inf] = np.nan
    return out, _reduce(bad, cb, rb, np.logical_or, False).T


def _grid(modules: Sequence[str] | np.ndarray, steps: np.ndarray, out: np.ndarray, marks: np.ndarray,
          rb: int, cb: int, n_cols: int) -> NormGrid:
    return NormGrid(_bin_labels(np.asarray(modules, dtype=object), rb), steps, out, marks, rb, cb,
                    len(modules), n_cols, tuple(str(m) for m in modules))


def _log_ticks(lo: float, hi: float) -> tuple[list[float], list[str]]:
    """Colour-bar ticks for log10 values from ``lo`` to ``hi``: whole decades, or 1, 2 and 5 of
    each decade when fewer than three decades would show (so a narrow range still reads).

    >>> _log_ticks(-0.43, 0.57)[1]
    ['0.5', '1', '2']
    """
    first, last = math.floor(lo + 1e-9), math.ceil(hi - 1e-9)
    if hi - lo < 3:
        pairs = [(d + math.log10(m), m, d) for d in range(first, last + 1) for m in (1, 2, 5)]
        inside = [(v, m, d) for v, m, d in pairs if lo - 1e-9 <= v <= hi + 1e-9]
        if len(inside) >= 2:
            return [v for v, _, _ in inside], [_tick_text(m, d) for _, m, d in inside]
    decades = list(range(math.floor(lo), math.ceil(hi) + 1)) or [0]
    step = max(1, math.ceil(len(decades) / 8))
    vals = [float(d) for d in decades[::step]]
    return vals, [_tick_text(1, int(d)) for d in vals]


def _tick_text(mantissa: int, decade: int) -> str:
    return f"{mantissa * 10.0 ** decade:g}" if -3 <= decade <= 3 else f"{mantissa}e{decade}"


def run_norm_grid(run: Any, column: str = "grad_norm", rank: int = 0, *, max_rows: int = MAX_ROWS,
                  max_cols: int = MAX_COLS) -> NormGrid:
    """The heatmap grid of a run's per-module ``column`` on ``rank`` (:class:`inspector.watching.Run`):
    :func:`bin_matrix` of ``run.matrix(column, rank)``, a recorded NaN (the module counted values
    not finite) marked as not finite, a value not taken left blank, steps in ascending order.

    The matrix is read and binned ``BLOCK_CELLS`` values at a time (whole columns of the grid), so a
    long run costs one block, not a second copy of its numbers."""
    steps = run.step_numbers(rank)
    if len(steps) > 1 and (np.diff(steps) < 0).any():  # steps out of order: sorted, read whole
        return _sorted_grid(run, column, rank, max_rows, max_cols)
    modules = run.module_order
    rb, cb = _per_bin(len(modules), len(steps), max_rows, max_cols)
    per = cb * max(1, BLOCK_CELLS // max(1, cb * len(modules)))
    outs, marks = [], []
    for start in range(0, max(1, len(steps)), per):
        values = run.matrix(column, rank, start=start, stop=start + per)[1]
        nonfinite = None
        if np.isnan(values).any():  # a NaN may be recorded (counted as not finite) or a value not taken
            nonfinite = run.matrix("nonfinite", rank, start=start, stop=start + per)[1] > 0
        out, mark = _binned(values, nonfinite, rb, cb)
        outs.append(out)
        marks.append(mark)
        del values, nonfinite
    return _grid(modules, steps[::cb], np.concatenate(outs, axis=1), np.concatenate(marks, axis=1), rb, cb,
                 len(steps))


def _sorted_grid(run: Any, column: str, rank: int, max_rows: int, max_cols: int) -> NormGrid:
    steps, values = run.matrix(column, rank)
    nonfinite = run.matrix("nonfinite", rank)[1] > 0 if np.isnan(values).any() else None
    order = np.argsort(steps, kind="stable")
    return bin_matrix(steps[order], values[order], run.module_order,
                      nonfinite=nonfinite[order] if nonfinite is not None else None,
                      max_rows=max_rows, max_cols=max_cols)


NONFINITE_COLOUR, PRODUCER_COLOUR = "#D62728", "#FFFFFF"


@escaped_figure
def norm_heatmap(grid: NormGrid, title: str = "Gradient norm per module and step",
                 producer: tuple[str, int] | None = None) -> go.Figure:
    """The grid as a heatmap with a log colour scale; every cell that held NaN or Inf painted red by
    a second heatmap layer (one cell per binned cell, so any size of run is marked whole), and the
    ``producer`` (module, step: the first ``nonfinite-forward``) marked with a star.

    The colours span the smallest to the largest nonzero norm; a zero norm (a dead gradient)
    takes the bottom colour, a decade below the smallest nonzero norm, labelled 0.
    """
    v = grid.values.astype(np.float64)
    positive = v[np.isfinite(v) & (v > 0)]
    lo = math.log10(float(positive.min())) if positive.size else 0.0
    hi = math.log10(float(positive.max())) if positive.size else 1.0
    zeros = bool((v == 0).any())
    floor = math.floor(lo + 1e-6) - 1 if zeros else lo  # float32 norms: 0.01 is a hair below 1e-2
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(v > 0, np.log10(np.where(v > 0, v, 1.0)), np.where(v == 0, floor, np.nan))
    tickvals, ticktext = _log_ticks(floor, max(hi, floor + 1))
    if positive.size and zeros:
        tickvals, ticktext = [float(floor)] + tickvals[1:], ["0"] + ticktext[1:]
    x = grid.steps.astype(np.int64)
    fig = go.Figure(
        go.Heatmap(
            z=z.astype(np.float32),
            x=x,
            y=grid.labels,
            customdata=v.astype(np.float32),
            colorscale="Viridis",
            zmin=floor,
            zmax=max(hi, floor + 1),
            hoverongaps=False,
            colorbar={"title": {"text": "norm"}, "tickvals": tickvals, "ticktext": ticktext},
            hovertemplate="%{y}<br>step %{x}"
            + ("" if grid.steps_per_bin == 1 else f" (+{grid.steps_per_bin - 1})")
            + "<br>norm %{customdata:.4g}<extra></extra>",
        )
    )
    keys = []
    if grid.nonfinite.any():
        layer = np.where(grid.nonfinite, 1.0, np.nan).astype(np.float32)
        fig.add_trace(go.Heatmap(z=layer, x=x, y=grid.labels,
                                 name="NaN or Inf", colorscale=[[0, NONFINITE_COLOUR], [1, NONFINITE_COLOUR]],
                                 zmin=0, zmax=1, showscale=False, hoverongaps=False,
                                 hovertemplate="%{y}<br>step %{x}<br>NaN or Inf<extra></extra>"))
        keys.append(f"<span style='color:{NONFINITE_COLOUR}'>■</span> NaN or Inf")
    cell = grid.cell_of(*producer) if producer else None
    if producer and cell is not None:
        fig.add_trace(go.Scatter(x=[x[cell[1]]], y=[grid.labels[cell[0]]], mode="markers", name="producer",
                                 marker={"symbol": "star", "size": 15, "color": PRODUCER_COLOUR,
                                         "line": {"color": "#000000", "width": 1.5}},
                                 hovertemplate=f"%{{y}}<br>step {producer[1]:,}<br>first produced NaN/Inf"
                                               "<extra></extra>"))
    if producer:
        keys.append(f"★ first NaN/Inf from {plot_text(module_label(producer[0]))} at step {producer[1]:,}")
    per = [f"{grid.rows_per_bin} modules" if grid.rows_per_bin > 1 else "",
           f"{grid.steps_per_bin} steps" if grid.steps_per_bin > 1 else ""]
    note = " and ".join(p for p in per if p)
    fig.update_layout(
        title=title + (f" (each cell: the largest of {note})" if note else ""),
        xaxis_title=f"step ({grid.step_count:,} recorded)", yaxis_title=f"module ({grid.modules:,})",
        yaxis={"autorange": "reversed", "automargin": True, "type": "category"},  # modules "0", "2": names
        xaxis=step_axis(float(x[0]), float(x[-1])) if len(x) else {"automargin": True},
        height=int(min(1_700, max(320, 13 * len(grid.labels) + 160))), showlegend=False,
        margin={"l": 60, "r": 20, "t": 80, "b": 50})
    if len(grid.labels) > 60:
        fig.update_yaxes(tickfont={"size": 10})
    if keys:  # the key sits above the plot, outside it: the module labels keep their room
        fig.add_annotation(text=" · ".join(keys), xref="paper", yref="paper", x=1, y=1, xanchor="right",
                           yanchor="bottom", showarrow=False, font={"size": 12})
    return fig
