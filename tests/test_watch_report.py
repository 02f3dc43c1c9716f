"""A watched run rendered: the report section, the bounded heatmap, and ``report RUN.inspect``."""

from __future__ import annotations

import numpy as np

from inspector import read_run
from inspector.__main__ import main
from inspector.report import Report, watch_report
from inspector.watch import heatmap, synthetic_run


def test_heatmap_is_bounded_and_keeps_the_spike(tmp_path):
    path = tmp_path / "r.inspect"
    synthetic_run(path, steps=1000, modules=40)  # module 20 is 1000x at step 750
    h = heatmap(read_run(path), max_steps=100, max_modules=10)
    assert h.values.shape == (10, 100) and (h.steps_per_column, h.modules_per_row) == (10, 4)
    assert h.modules[5] == "layers.20 … layers.23" and h.steps[75] == 750
    row, col = np.unravel_index(np.nanargmax(h.values), h.values.shape)
    assert (row, col) == (5, 75)  # max-pooling keeps the one-step spike in its cell


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
