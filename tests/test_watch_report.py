"""A watched run rendered: the report section, the bounded heatmap, and ``report RUN.inspect``."""

from __future__ import annotations

import json

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
    layer = np.asarray(marks["z"], dtype=np.float64)
    assert marks["name"] == "NaN or Inf" and (layer == 1).tolist() == [[False] * 3, [False] * 3, [True] * 3]


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


def test_a_run_report_opens_with_the_first_error_and_gives_every_finding_its_step(tmp_path, capsys):
    from inspector import Finding
    from inspector.watching import RunMeta, RunWriter, StepRecord

    modules = ("embed", "blocks.0", "head")
    meta = RunMeta(model="tiny", world_size=1, every=1, modules=modules,
                   parameters=tuple(f"{m}.weight" for m in modules), parameter_modules=(0, 1, 2))
    spike = Finding("loss-spike", "warning", "(model)", "loss 40x its median").to_dict()
    producer = Finding("nonfinite-forward", "error", "blocks.0", "produced NaN from finite inputs").to_dict()
    path = tmp_path / "r.inspect"
    with RunWriter(path, meta) as writer:
        for step in range(5):
            norms = np.full(3, step + 1.0, np.float32)
            writer.write([StepRecord(step=step, rank=0, time=float(step), loss=1.0, grad_norm=1.0,
                                     module_grad_norm=norms, module_nonfinite=np.zeros(3, np.int32),
                                     param_grad_norm=norms,
                                     findings={1: [spike], 3: [producer]}.get(step, []))])
    report = watch_report(read_run(path))
    first = "First error: step 3 · nonfinite-forward at blocks.0 — produced NaN from finite inputs"
    assert report.section("findings").note == first
    assert [(f.code, f.message) for _, f in report.findings] == [
        ("nonfinite-forward", "step 3: produced NaN from finite inputs"),
        ("loss-spike", "step 1: loss 40x its median")]
    md = report.to_markdown().splitlines()
    assert md[0] == "# Run report: tiny" and not any(" on ." in line for line in md[:3])
    assert md[md.index("## Findings") + 2] == f"**{first}**"
    html = report.to_html()
    assert "<p class=\"verdict\"><strong>First error: step 3 · nonfinite-forward at blocks.0" in html
    assert " on <code></code>" not in html
    assert json.loads(report.to_json())["findings"][0]["message"].startswith("step 3: ")
    assert main(["report", str(path), "-o", str(tmp_path / "r.md")]) == 0
    assert first in capsys.readouterr().err
