"""Figures of a training run: the binned module × step heatmap, the loss and norm lines, the findings
timeline."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from inspector.figures.distributed import grad_norm_figure, memory_figure, rank_colour
from inspector.figures.training import (
    MAX_COLS,
    MAX_ROWS,
    bin_matrix,
    envelope,
    findings_timeline,
    loss_norm_figure,
    norm_grid,
    norm_heatmap,
)


def _long(drop=(), order="steps") -> pd.DataFrame:
    """5 modules × 7 steps; module m at step s holds 10 s + m. Planted: Inf at (5, m4), a recorded
    NaN at (6, m0); nothing recorded at (1, m1), (6, m3), (6, m4)."""
    rows = [(s, f"m{m}", 10.0 * s + m) for s in range(7) for m in range(5) if (s, m) not in drop]
    frame = pd.DataFrame(rows, columns=["step", "module", "grad_norm"])
    frame.loc[(frame.step == 5) & (frame.module == "m4"), "grad_norm"] = math.inf
    frame.loc[(frame.step == 6) & (frame.module == "m0"), "grad_norm"] = math.nan
    return frame.sample(frac=1.0, random_state=0) if order == "shuffled" else frame


@pytest.mark.parametrize("order", ["steps", "shuffled"])
def test_grid_cells_hold_the_largest_finite_value_of_their_block(order):
    frame = _long(drop={(1, 1), (6, 3), (6, 4)}, order=order)
    if order == "shuffled":  # first appearance decides the module order: keep m0..m4 first
        frame = pd.concat([frame[frame.step == 0].sort_values("module"), frame[frame.step != 0]])
    g = norm_grid(frame, max_rows=2, max_cols=3)
    # 5 modules in rows of ceil(5/2) = 3 ({m0, m1, m2}, {m3, m4}); 7 steps in columns of ceil(7/3) = 3
    assert (g.rows_per_bin, g.steps_per_bin, g.modules, g.step_count) == (3, 3, 5, 7)
    assert g.labels == ["m0 (+2)", "m3 (+1)"]
    assert g.steps.tolist() == [0, 3, 6]
    # row 0: steps 0-2 -> 22 (step 2, m2); 3-5 -> 52; 6 -> 62 (m0's NaN left out)
    # row 1: 24; steps 3-5 without the Inf at (5, m4) -> 53; step 6 recorded nothing -> empty
    expected = [[22, 52, 62], [24, 53, math.nan]]
    np.testing.assert_array_equal(g.values, np.array(expected))
    assert g.nonfinite.tolist() == [[False, False, True], [False, True, False]]


def test_the_same_grid_from_a_steps_by_modules_array():
    values = np.array([[10.0 * s + m for m in range(5)] for s in range(7)], dtype=np.float32)
    values[5, 4] = np.inf
    values[6, 0] = np.nan
    recorded_nan = np.zeros_like(values, dtype=bool)
    recorded_nan[6, 0] = True
    g = bin_matrix(
        np.arange(7), values, [f"m{m}" for m in range(5)], nonfinite=recorded_nan, max_rows=2, max_cols=3
    )
    np.testing.assert_array_equal(g.values, np.array([[22, 52, 62], [24, 53, 64]]))
    assert g.nonfinite.tolist() == [[False, False, True], [False, True, False]]
    # a NaN nobody marked as recorded is a value not taken: an empty cell, no mark
    g = bin_matrix(np.arange(7), values, [f"m{m}" for m in range(5)], max_rows=5, max_cols=7)
    assert math.isnan(g.values[0, 6]) and not g.nonfinite[0, 6] and g.nonfinite[4, 5]


def test_a_big_run_is_binned_to_a_bounded_grid_that_keeps_its_spike():
    rng = np.random.default_rng(0)
    values = rng.random((10_000, 1_000), dtype=np.float32)
    values[7_777, 555] = 1e6
    g = bin_matrix(np.arange(10_000), values, [f"layers.{i}" for i in range(1_000)])
    assert g.values.shape[0] <= MAX_ROWS and g.values.shape[1] <= MAX_COLS
    # 1,000 modules in rows of ceil(1000/120) = 9, 10,000 steps in columns of ceil(10000/300) = 34
    assert (g.rows_per_bin, g.steps_per_bin) == (9, 34)
    r, c = np.unravel_index(np.nanargmax(g.values), g.values.shape)
    assert (r, c) == (555 // 9, 7_777 // 34) and g.values[r, c] == 1e6
    assert g.labels[r] == "layers.549 (+8)"
    fig = norm_heatmap(g)
    assert len(fig.to_json()) < 1_000_000


def test_heatmap_colour_bar_has_readable_ticks_on_a_narrow_range():
    # norms 0.37 to 1.9: less than one decade; whole decades alone would leave the single tick 1
    frame = pd.DataFrame({"step": [0, 0, 1, 1], "module": ["a", "b"] * 2, "grad_norm": [0.37, 1.0, 1.9, 0.8]})
    heat = norm_heatmap(norm_grid(frame)).data[0]
    assert list(heat.colorbar.ticktext) == ["0.5", "1", "2"]
    np.testing.assert_allclose(heat.colorbar.tickvals, np.log10([0.5, 1, 2]))
    assert all(heat.zmin <= v <= heat.zmax for v in heat.colorbar.tickvals)


def test_heatmap_colours_by_decade_and_marks_nonfinite_cells():
    frame = pd.DataFrame({"step": [0, 0, 1, 1, 2, 2], "module": ["a", "b"] * 3,
                          "grad_norm": [0.01, 100.0, 0.0, 1.0, math.inf, 10.0]})
    fig = norm_heatmap(norm_grid(frame))
    heat = fig.data[0]
    z = np.asarray(heat.z, dtype=float)  # rows a, b; columns steps 0, 1, 2
    # log10: a: -2, (zero -> the floor one decade below the smallest, -3), (Inf: empty); b: 2, 0, 1
    np.testing.assert_allclose(z[0, :2], [-2, -3])
    assert math.isnan(z[0, 2])
    np.testing.assert_allclose(z[1], [2, 0, 1])
    assert heat.colorbar.ticktext[0] == "0" and heat.zmin == -3 and heat.zmax == 2
    marks = fig.data[1]  # a heatmap layer over the norms: red where a cell held NaN or Inf, empty elsewhere
    assert marks.type == "heatmap" and marks.name == "NaN or Inf" and list(marks.y) == ["a", "b"]
    layer = np.asarray(marks.z, dtype=float)
    assert (layer == 1).tolist() == [[False, False, True], [False, False, False]] and np.isnan(layer[1]).all()
    # no zero: the colours span the smallest to the largest norm, 0.5 to 8
    heat = norm_heatmap(norm_grid(frame.assign(grad_norm=[0.5, 1.0, 2.0, 4.0, 8.0, 1.0]))).data[0]
    assert (heat.zmin, heat.zmax) == pytest.approx((math.log10(0.5), math.log10(8.0)))


def test_heatmap_escapes_module_names():
    frame = pd.DataFrame({"step": [0], "module": ['<img src="x">'], "grad_norm": [1.0]})
    heat = norm_heatmap(norm_grid(frame)).data[0]
    assert list(heat.y) == ["&lt;img src=\"x\"&gt;"]


def test_envelope_keeps_each_bins_extremes_in_order():
    x = np.arange(10_000)
    y = np.ones(10_000)
    y[4_321] = 50.0
    y[9_000] = -3.0
    y[5] = np.nan
    ex, ey = envelope(x, y, max_points=100)
    assert len(ex) <= 100 and (np.diff(ex) > 0).all()
    assert 4_321 in ex and 9_000 in ex and 5 not in ex
    assert ey.max() == 50.0 and ey.min() == -3.0


def test_loss_and_norm_lines_mark_the_steps_that_were_not_finite():
    steps = pd.DataFrame({"step": [0, 1, 2, 3], "loss": [2.0, 1.5, math.inf, 1.0],
                          "grad_norm": [3.0, math.nan, 2.0, 1.0], "nonfinite": [0, 4, 0, 0]})
    fig = loss_norm_figure(steps)
    names = [t.name for t in fig.data]
    mark = "NaN or Inf (drawn at the bottom of its panel)"
    assert names == ["loss", mark, "global gradient norm", mark]
    # the legend explains the red x once, and only the red x (each line is named by its panel's title)
    assert [t.showlegend for t in fig.data] == [False, True, False, False] and fig.layout.showlegend
    assert list(fig.data[0].x) == [0, 1, 3] and list(fig.data[1].x) == [2]
    assert list(fig.data[2].x) == [0, 2, 3] and list(fig.data[3].x) == [
        1
    ]  # a NaN flagged by the step's count
    assert fig.layout.yaxis2.type == "log"
    no_loss = loss_norm_figure(steps.drop(columns=["loss"]))
    assert [t.name for t in no_loss.data][0] == "global gradient norm"
    assert not loss_norm_figure(steps.assign(loss=1.0, grad_norm=1.0)).layout.showlegend  # nothing to explain


def test_findings_timeline_puts_each_finding_at_its_step():
    found = pd.DataFrame({"step": [40, 7, 7], "rank": [None, 1, None],
                          "severity": ["warning", "error", "error"],
                          "code": ["exploding-gradient", "nonfinite-forward", "dead-gradient"],
                          "where": ["layers.3", "blocks.<b>0</b>", "head"], "message": ["m1", "m2", "m3"]})
    fig = findings_timeline(found)
    assert [t.name for t in fig.data] == ["error", "warning"]
    errors = fig.data[0]
    assert list(errors.x) == [7, 7] and list(errors.y) == ["nonfinite-forward", "dead-gradient"]
    assert errors.customdata[0][0] == "blocks.&lt;b&gt;0&lt;/b&gt; on rank 1"
    assert list(fig.data[1].x) == [40] and fig.layout.clickmode == "event+select"


def test_rank_lines_stay_visible_over_the_global_norm_and_keep_their_colours():
    # replicas: both ranks hold the global norm exactly (``--shard none``)
    per_rank = pd.DataFrame(
        {
            "step": [0, 0, 1, 1],
            "rank": [0, 1, 0, 1],
            "grad_norm": [2.0, 2.0, 1.0, 1.0],
            "param_bytes": [2**30] * 4,
            "grad_bytes": [2**30] * 4,
            "buffer_bytes": [3072] * 4,
            "rss": [600 * 2**20] * 4,
            "peak_rss": [700 * 2**20] * 4,
        }
    )
    steps = pd.DataFrame({"step": [0, 1], "grad_norm": [2.0, 1.0]})
    fig = grad_norm_figure(per_rank, steps)
    assert [t.name for t in fig.data] == [
        "global",
        "rank 0",
        "rank 1",
    ]  # the global band is drawn first, under
    assert fig.data[0].line.width > fig.data[1].line.width
    assert fig.data[1].marker.symbol != fig.data[2].marker.symbol
    assert fig.data[1].line.dash != fig.data[2].line.dash
    memory = memory_figure(per_rank, 1)
    assert [t.name for t in memory.data] == ["rank 0", "rank 1"]
    assert [t.marker.color for t in memory.data] == [rank_colour(0), rank_colour(1)] == \
           [t.line.color for t in fig.data[1:]]
    # 3 KiB of buffers beside 1 GiB: a log axis whose range starts below the smallest bar
    assert memory.layout.yaxis.type == "log" and memory.layout.yaxis.range[0] < math.log10(3072)
    assert list(memory.data[0].text) == ["1.0 GiB", "1.0 GiB", "3.0 KiB", "600.0 MiB", "700.0 MiB"]
    assert "KiB" in " ".join(memory.layout.yaxis.ticktext) and "GiB" in " ".join(memory.layout.yaxis.ticktext)


def test_heatmap_rows_of_a_sequential_are_names_not_numbers():
    # nn.Sequential names its modules "0", "2", "4": a numeric axis would space them by value
    frame = pd.DataFrame({"step": [0, 0, 0], "module": ["0", "2", "10"], "grad_norm": [1.0, 2.0, 3.0]})
    fig = norm_heatmap(norm_grid(frame))
    assert fig.layout.yaxis.type == "category" and list(fig.data[0].y) == ["0", "2", "10"]


def test_a_logged_nan_loss_is_marked_even_with_finite_gradients(tmp_path):
    import torch

    from inspector import read_run, watch

    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for step in range(3):
            loss = model(torch.ones(1, 2)).sum()
            loss.backward()  # finite gradients on every step
            if step == 1:
                w.log(loss=torch.tensor(float("nan")))  # step 1 logs a NaN loss; step 0 logs none
            elif step == 2:
                w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    steps = read_run(tmp_path / "r.inspect").steps
    assert steps["loss_logged"].tolist() == [False, True, True]
    marks = [t for t in loss_norm_figure(steps).data if t.name.startswith("NaN or Inf")]
    assert [list(t.x) for t in marks] == [[1]]  # the logged NaN, not the step that logged nothing


def test_every_nonfinite_cell_of_a_big_run_is_marked_and_the_producer_starred():
    # 10,000 steps x 1,000 modules, every module NaN from step 6,000 on, the producer layers.700 at 6,000:
    # each binned cell from 6,000 on is red (no cap on the marks), and the star sits on the producer's cell
    values = np.ones((10_000, 1_000), dtype=np.float32)
    values[6_000:] = np.nan
    g = bin_matrix(np.arange(10_000), values, [f"layers.{i}" for i in range(1_000)],
                   nonfinite=np.isnan(values))
    fig = norm_heatmap(g, producer=("layers.700", 6_000))
    layer = np.asarray(fig.data[1].z, dtype=float)
    first = 6_000 // g.steps_per_bin  # 6,000 // 34 = 176: the column holding step 6,000
    assert layer.shape == g.values.shape
    assert (layer[:, first:] == 1).all() and np.isnan(layer[:, :first]).all()
    assert (layer == 1).sum() == g.values.shape[0] * (g.values.shape[1] - first) > 2_000
    star = fig.data[2]
    assert list(star.y) == [g.labels[700 // g.rows_per_bin]] and list(star.x) == [g.steps[first]]
    assert "first NaN/Inf from layers.700 at step 6,000" in fig.layout.annotations[0].text
    assert not fig.layout.showlegend  # the key is an annotation: the module labels keep their room


def test_a_runs_grid_is_binned_block_by_block_as_the_whole_matrix_is(tmp_path, monkeypatch):
    """``run_norm_grid`` reads a run ``BLOCK_CELLS`` values at a time, never the whole steps × modules
    matrix, and gives the grid :func:`bin_matrix` gives of the whole matrix: an Inf and a recorded NaN
    marked in their cells, a spike kept, steps where a number was not taken left blank, each rank its own."""
    import tracemalloc

    from inspector.figures import training
    from inspector.watching import RunMeta, RunWriter, StepRecord, read_run

    steps, modules, world = 3_001, 50, 2
    rng = np.random.default_rng(0)
    norms = rng.random((world, steps, modules), dtype=np.float32) + 0.5
    counts = np.zeros((world, steps, modules), np.int32)
    norms[0, 1_234, 7], counts[0, 1_234, 7] = np.inf, 1
    norms[0, 2_999, 0], counts[0, 2_999, 0] = np.nan, 1  # a NaN the module counted: recorded
    norms[1, 500, 3] = 1e6  # rank 1's spike
    names = tuple(f"m{i}" for i in range(modules))
    meta = RunMeta(model="toy", world_size=world, every=1, modules=names, parameters=(), parameter_modules=())
    with RunWriter(tmp_path / "r.inspect", meta) as w:
        for s in range(steps):
            w.write([StepRecord(step=s, rank=r, time=0.0, module_grad_norm=norms[r, s],
                                module_nonfinite=counts[r, s],
                                module_param_norm=norms[r, s] * 2 if s % 10 == 0 else None)  # every 10th step
                     for r in range(world)])
    run = read_run(tmp_path / "r.inspect")
    monkeypatch.setattr(training, "BLOCK_CELLS", 1_000)  # 11 steps (one column) a block: 273 blocks
    for column in ("grad_norm", "param_norm"):
        for rank in range(world):
            got = training.run_norm_grid(run, column, rank)
            step_numbers, values = run.matrix(column, rank)
            whole = bin_matrix(step_numbers, values, names, nonfinite=run.matrix("nonfinite", rank)[1] > 0)
            np.testing.assert_array_equal(got.values, whole.values)
            np.testing.assert_array_equal(got.nonfinite, whole.nonfinite)
            np.testing.assert_array_equal(got.steps, whole.steps)
            assert (got.labels, got.rows_per_bin, got.steps_per_bin, got.modules, got.step_count) == \
                (whole.labels, 1, 11, modules, steps)
    g = training.run_norm_grid(run, "grad_norm", 0)
    assert g.nonfinite.sum() == 2 and g.nonfinite[7, 1_234 // 11] and g.nonfinite[0, 2_999 // 11]
    assert not np.isnan(g.values[:, :-1]).any()  # every cell holds a finite norm of its block
    assert training.run_norm_grid(run, "grad_norm", 1).values[3, 500 // 11] == 1e6
    p = training.run_norm_grid(run, "param_norm", 0)
    assert np.isfinite(p.values).all()  # each column of 11 steps holds a 10th step, where it was taken
    # a norm not taken where the module counted NaN/Inf values reads as not finite: the planted steps
    assert np.argwhere(p.nonfinite).tolist() == [[0, 2_999 // 11], [7, 1_234 // 11]]
    matrix_bytes = steps * modules * 4
    tracemalloc.start()
    training.run_norm_grid(run, "grad_norm", 1, max_cols=30)  # a grid of 50 × 30 cells, blocks of 101 steps
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"binning peak {peak / 1024:.0f} KiB for a matrix of {matrix_bytes / 1024:.0f} KiB")
    assert peak < matrix_bytes / 2


def test_a_run_with_steps_out_of_order_is_binned_in_step_order(tmp_path):
    from inspector.figures import training
    from inspector.watching import RunMeta, RunWriter, StepRecord, read_run

    meta = RunMeta(model="toy", world_size=1, every=1, modules=("a", "b"), parameters=(),
                   parameter_modules=())
    with RunWriter(tmp_path / "r.inspect", meta) as w:  # a resumed run writes steps 2 and 3 again
        for s in (0, 1, 2, 3, 2, 3):
            w.write([StepRecord(step=s, rank=0, time=0.0, module_grad_norm=np.array([s, 10 + s], np.float32),
                                module_nonfinite=np.zeros(2, np.int32))])
    g = training.run_norm_grid(read_run(tmp_path / "r.inspect"), max_cols=2)
    # in step order 0, 1, 2, 2, 3, 3: columns of 3 rows, steps 0-2 and 2-3
    assert g.steps.tolist() == [0, 2] and g.values.tolist() == [[2, 3], [12, 13]]


def test_a_run_of_no_modules_or_no_steps_gives_an_empty_grid_that_draws():
    for steps, modules in ((3, 0), (0, 4)):
        names = [f"m{i}" for i in range(modules)]
        g = bin_matrix(np.arange(steps), np.zeros((steps, modules), np.float32), names)
        assert g.values.shape == (modules, steps) and not g.nonfinite.any()
        assert norm_heatmap(g).data[0].type == "heatmap"
