"""Run files inside the limits that used to cost minutes: many learning rates or scalar names (one column
each) compared, printed and reported in one pass, and JSON-lines files of many tiny records refused by
their line count before any is parsed."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from inspector import InspectorError, compare
from inspector.__main__ import main
from inspector.comparison import SHOWN_QUANTITIES, shown_step_columns
from inspector.runfiles import MAX_JSONL_RECORDS
from inspector.watching import RunMeta, RunWriter, StepRecord, parse_run_bytes, read_run

META = RunMeta(model="m", world_size=1, every=1, modules=("a",), parameters=("a.w",), parameter_modules=(0,))


def wide_run(path, lrs: int, *, shift: float = 0.0, steps: int = 3) -> str:
    """``lrs`` param groups; group g's lr at step s is g/1000 + s (+ ``shift``); loss 1 at every step."""
    with RunWriter(path, META) as w:
        for s in range(steps):
            w.write([StepRecord(step=s, rank=0, time=0.0, loss=1.0,
                                lr=list(np.arange(lrs) * 1e-3 + s + shift))])
    return str(path)


def test_twenty_thousand_learning_rates_compare_in_one_pass(tmp_path):
    """Each column converted and compared once: 20,000 lrs took 33 s when a column at a time was inserted
    into the steps table (quadratic); one pass takes well under a second (15 s: a loaded machine)."""
    n = 20_000
    a, b = wide_run(tmp_path / "a.inspect", n), wide_run(tmp_path / "b.inspect", n, shift=0.5)
    start = time.perf_counter()
    result = compare(a, b)
    assert time.perf_counter() - start < 15
    assert result.first_divergence == 0
    assert len(result.first_quantities) == n and result.first_quantities[:2] == ("lr_0", "lr_1")
    # step, then loss, grad_norm, nonfinite and skipped (each step records them), the n lrs; × (a, b, diff)
    assert [c.removesuffix("_a") for c in result.steps.columns[1:13:3]] == ["loss", "grad_norm", "nonfinite",
                                                                           "skipped"]
    assert result.steps.shape == (3, 1 + 3 * (n + 4)) and result.facts["quantities"] == n + 4
    steps = result.steps.set_index("step")
    # lr_19999 at step 2: 19.999 + 2 = 21.999 in A, 22.499 in B: |B - A| / max = 0.5 / 22.499
    assert steps.loc[2, "lr_19999_a"] == pytest.approx(21.999)
    assert steps.loc[2, "lr_19999_diff"] == pytest.approx(0.5 / 22.499)
    assert steps["loss_diff"].tolist() == [0.0, 0.0, 0.0]
    assert compare(a, wide_run(tmp_path / "same.inspect", n)).codes() == ["runs-agree"]


def test_the_command_line_prints_a_bounded_table_and_says_what_it_left_out(tmp_path, capsys):
    n = 2_000
    a, b = wide_run(tmp_path / "a.inspect", n), wide_run(tmp_path / "b.inspect", n, shift=0.5)
    assert main(["compare", a, b, "--json", str(tmp_path / "all.json")]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("step "))
    assert len(header.split()) == 1 + 3 * SHOWN_QUANTITIES  # not 6,007 columns
    assert "lr_0, lr_1" in out and "and 1,990 more" in out  # the parted numbers: 10 named
    assert f"({n + 4 - SHOWN_QUANTITIES:,} more compared numbers not shown" in out
    data = json.loads((tmp_path / "all.json").read_text())
    assert len(data["steps"]) == 3 and len(data["steps"][0]) == 1 + 3 * (n + 4)  # the JSON holds every one
    assert data["steps"][1]["lr_1999_b"] == pytest.approx(1.999 + 1 + 0.5)


def test_shown_columns_put_the_parted_numbers_first(tmp_path):
    a, b = wide_run(tmp_path / "a.inspect", 50), wide_run(tmp_path / "b.inspect", 50)
    columns, left = shown_step_columns(compare(a, b), 4)
    assert columns == ["step", "loss_a", "loss_b", "loss_diff", "grad_norm_a", "grad_norm_b",
                       "grad_norm_diff", "nonfinite_a", "nonfinite_b", "nonfinite_diff", "skipped_a",
                       "skipped_b", "skipped_diff"] and left == 50
    with RunWriter(tmp_path / "c.inspect", META) as w:  # only lr_30 differs
        for s in range(3):
            lrs = np.arange(50) * 1e-3 + s
            lrs[30] += 1
            w.write([StepRecord(step=s, rank=0, time=0.0, loss=1.0, lr=list(lrs))])
    result = compare(a, tmp_path / "c.inspect")
    assert result.first_quantities == ("lr_30",)
    columns, _ = shown_step_columns(result, 3)
    assert columns[7:] == ["lr_30_a", "lr_30_b", "lr_30_diff"]
    assert len(shown_step_columns(result, None)[0]) == 1 + 3 * 54


def test_a_report_of_a_wide_run_shows_its_first_columns(tmp_path):
    from inspector.report import watch_report

    report = watch_report(read_run(wide_run(tmp_path / "a.inspect", 5_000)))
    table = report.sections[1].tables[0]
    assert len(table.columns) == 40  # the first 40 of 5,012
    assert "4,9" in table.note and "more (learning rates, logged scalars) are in the run file" in table.note


MINIMAL = {"format": "inspector-distributed", "step": 0, "world_size": 1, "ranks": [], "tensors": [],
           "global": {}}


def test_a_json_lines_file_of_too_many_records_is_refused_before_parsing(tmp_path):
    """100,001 tiny records (9 MB): parsed one by one they cost seconds and gave 0 rows; counted first,
    the file is refused at once, naming it and the limit."""
    path = tmp_path / "many.jsonl"
    line = json.dumps(MINIMAL) + "\n"
    path.write_text(line * (MAX_JSONL_RECORDS + 1))
    start = time.perf_counter()
    with pytest.raises(InspectorError, match=r"many.jsonl is a JSON-lines run file of 100,001 lines; "
                                             r"this older format is read up to 100,000 step records"):
        read_run(path)
    assert time.perf_counter() - start < 5  # a count of newlines: well under a second
    with pytest.raises(InspectorError, match="up.jsonl is a JSON-lines run file of 100,001 lines"):
        parse_run_bytes(path.read_bytes(), "up.jsonl")
    ok = tmp_path / "ok.jsonl"
    ok.write_text(line * 3)
    assert read_run(ok).kind == "check"
