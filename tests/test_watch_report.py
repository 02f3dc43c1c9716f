"""A watched run rendered: the report section, the bounded heatmap, and ``report RUN.inspect``."""

from __future__ import annotations

import numpy as np

from inspector import read_run
from inspector.__main__ import main
from inspector.figures import run_norm_grid
from inspector.report import Report, watch_report
from inspector.watching import RunMeta, RunWriter, StepRecord, synthetic_run


def test_heatmap_is_bounded_and_keeps_the_spike(tmp_path):
    path = tmp_path / "r.inspect"
    synthetic_run(path, steps=1000, modules=40)  # module 20 is 1000x at step 750
    g = run_norm_grid(read_run(path), max_cols=100, max_rows=10)
    assert g.values.shape == (10, 100) and (g.steps_per_bin, g.rows_per_bin) == (10, 4)
    assert g.labels[5].startswith("layers.20") and g.steps[75] == 750
    row, col = np.unravel_index(np.nanargmax(g.values), g.values.shape)
    assert (row, col) == (5, 75)  # max-pooling keeps the one-step spike in its cell


def test_the_report_heatmap_shows_dead_and_nonfinite_gradients(tmp_path):
    """Modules a, b, c: a's gradient is zero (dead), b's is 2, c's is NaN (counted not finite)."""
    path = tmp_path / "dead.inspect"
    meta = RunMeta(model="m", world_size=1, every=1, modules=("a", "b", "c"),
                   parameters=("a.w", "b.w", "c.w"), parameter_modules=(0, 1, 2))
    norms = np.array([0.0, 2.0, np.nan], np.float32)
    with RunWriter(path, meta) as w:
        w.write([StepRecord(step=s, rank=0, time=float(s), loss=1.0, grad_norm=float("nan"), nonfinite=1,
                            module_grad_norm=norms, module_nonfinite=np.array([0, 0, 1], np.int32),
                            param_grad_norm=norms) for s in range(3)])
    report = watch_report(read_run(path))
    figure = next(
        f for s in report.sections for f in s.figures if f.title == "Gradient norm per module and step"
    )
    heat, marks = figure.figure["data"][0], figure.figure["data"][1]
    z = np.asarray(heat["z"], dtype=np.float64) if not isinstance(heat["z"], dict) else None
    assert (
        z is not None and np.isfinite(z[0]).all() and np.isfinite(z[1]).all()
    )  # zero has a colour, not a gap
    assert z[0, 0] < z[1, 0] and np.isnan(z[2]).all()
    assert marks["name"] == "NaN or Inf" and list(marks["y"]) == ["c"] * 3


def test_report_of_a_watched_run(tmp_path, capsys):
    path = tmp_path / "r.inspect"
    synthetic_run(path, steps=300, modules=6)
    report = watch_report(read_run(path))
    assert [s.id for s in report.sections] == ["findings", "run", "modules"]
    text = report.to_markdown()
    assert "exploding-gradient" in text and "Modules at step 299" in text
    assert [s.id for s in Report.from_json(report.to_json()).sections] == ["findings", "run", "modules"]
    out = tmp_path / "r.md"
    assert main(["report", str(path), "-o", str(out)]) == 0
    assert "layers.3" in out.read_text()
