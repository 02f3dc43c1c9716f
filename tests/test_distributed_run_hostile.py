"""Run files with wrong types: refused with the file and line named, never a raw exception or markup."""

from __future__ import annotations

import copy
import json

import pandas as pd
import pytest
import torch
from torch import nn

from inspector.__main__ import main
from inspector.distributed import parse_run
from inspector.distributed.check import check_step
from inspector.figures.distributed import grad_norm_figure, memory_figure
from inspector.findings import Finding, InspectorError
from tests.apptest import run_page


@pytest.fixture(scope="module")
def record() -> dict:
    """One check_step record of a 2 -> 1 linear layer, in this process (world of 1)."""
    torch.manual_seed(0)
    m = nn.Linear(2, 1)
    m(torch.ones(1, 2)).sum().backward()
    return json.loads(json.dumps(check_step(m, 0, path=None).record))


def _with(record: dict, change) -> str:
    rec = copy.deepcopy(record)
    change(rec)
    return json.dumps(record) + "\n" + json.dumps(rec) + "\n"


HOSTILE = [
    (lambda r: r.update(ranks=5), r"ranks must be a list of objects"),
    (lambda r: r.update({"global": []}), r"global must be an object of numbers"),
    (lambda r: r.update(world_size="x"), r"world_size must be a positive integer, not 'x'"),
    (lambda r: r.update(step="![x](http://h/x.png)"), r"step must be an integer, not '!\[x\]"),
    (lambda r: r.update(step=True), r"step must be an integer, not True"),
    (lambda r: r["ranks"][0].update(rank="<b>0</b>"), r"each rank's \"rank\" must be an integer"),
    (lambda r: r["ranks"][0].update(rank=3), r"each rank's \"rank\" must be an integer from 0 to world_size - 1, not 3"),
    (lambda r: r["ranks"][0].update(param_bytes="1"), r"rank 0 has a non-numeric param_bytes"),
    (lambda r: r.update(tensors=[{"name": 1}]), r"tensors must be a list of objects, each with a string name"),
    (lambda r: r["tensors"][0].update(nan=1), r"tensor 'weight': nan, inf, replica_key and hash must be lists"),
    (lambda r: r.update(findings=[{"code": "c", "severity": "info", "where": "", "message": "m", "x": 1}]),
     r"a finding has exactly the keys code, severity, where, message; got code, message, severity, where, x"),
    (lambda r: r.update(findings=[{"code": 1, "severity": "info", "where": "", "message": "m"}]),
     r"a finding's code, severity, where, message are strings"),
    (lambda r: r.update(findings=[{"code": "c", "severity": "fatal", "where": "", "message": "m"}]),
     r"Finding severity must be one of"),
    (lambda r: r.update(backend=["gloo"]), r"backend and note must be strings"),
]


@pytest.mark.parametrize("change, message", HOSTILE)
def test_wrong_types_name_the_file_and_line(record, change, message):
    with pytest.raises(InspectorError, match=r"run.jsonl line 2 is not a valid check_step record: " + message):
        parse_run(_with(record, change), "run.jsonl")


def test_cli_report_exits_2_on_a_wrongly_typed_run_file(record, tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    path.write_text(_with(record, lambda r: r.update(ranks=5)), encoding="utf-8")
    assert main(["report", str(path), "-o", str(tmp_path / "out")]) == 2
    assert "line 2 is not a valid check_step record" in capsys.readouterr().err


def test_a_valid_record_still_reads(record):
    run = parse_run(_with(record, lambda r: r.update(step=1)), "run.jsonl")
    assert run.steps["step"].tolist() == [0, 1]
    assert run.world_size == 1


def test_page_shows_an_error_not_the_image_a_step_asks_for(record, tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text(_with(record, lambda r: r.update(step="![x](http://h/x.png)")), encoding="utf-8")
    at = run_page("8_Training.py", query={"run": str(path)})
    assert len(at.error) == 1 and "step must be an integer" in at.error[0].value
    assert not [s for s in at.subheader if "Tensors at step" in s.value]


def test_figures_escape_values_from_the_file():
    name = '<a href="http://h">r</a>'
    per_rank = pd.DataFrame({"step": [0], "rank": [name], "grad_norm": [1.0], "param_bytes": [2**20],
                             "grad_bytes": [0], "buffer_bytes": [0], "device_allocated": [None],
                             "device_peak": [None], "rss": [None]})
    steps = pd.DataFrame({"step": [0], "grad_norm": [1.0]})
    norms = grad_norm_figure(per_rank, steps)  # the global norm first, then the ranks
    assert norms.data[1].name == "rank &lt;a href=\"http://h\"&gt;r&lt;/a&gt;"
    assert "<a " not in norms.data[1].hovertemplate
    memory = memory_figure(per_rank, 0)
    assert memory.data[0].name == "rank &lt;a href=\"http://h\"&gt;r&lt;/a&gt;"
    assert "<a " not in memory.data[0].hovertemplate


def test_finding_from_dict_round_trips():
    f = Finding("c", "warning", "w", "m")
    assert Finding.from_dict(f.to_dict()) == f
