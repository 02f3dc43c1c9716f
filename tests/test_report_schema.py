"""Every kind of report JSON the project makes validates against the shipped report_schema.json: a
model's report (every section, a comparison among them), a lab's, a watched run's (with its
``modules`` and ``captures`` sections) and a ``check_step`` run's, the last two through the one
``run_report(read_run(path))``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import pytest
import torch
from torch import nn

from inspector import build_report, load_model, read_run, run_report, watch
from inspector.distributed import check_step

SCHEMA = json.loads((Path(__file__).resolve().parent.parent / "inspector/report_schema.json").read_text())


def _valid(report) -> dict:
    data = json.loads(report.to_json())
    jsonschema.validate(data, SCHEMA)
    return data


@pytest.fixture
def watched(tmp_path) -> Path:
    """A Linear(2, 1) watched for 4 steps, the batch of step 2 NaN (a captured producer)."""
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    path = tmp_path / "run.inspect"
    with watch(model, None, path, nonfinite=True) as w:
        for step in range(4):
            loss = model(torch.ones(1, 2) * (math.nan if step == 2 else 1.0)).sum()
            loss.backward()
            w.log(loss=loss)
            w.step()
            opt.zero_grad()
    return path


def test_a_watched_runs_report_validates_and_reads_through_run_report(watched):
    data = _valid(run_report(read_run(watched)))
    ids = [s["id"] for s in data["sections"]]
    assert "modules" in ids and "captures" in ids
    assert _valid(run_report(watched))["sections"][0]["id"] == ids[0]  # a path works alike


def test_a_check_step_runs_report_validates_and_reads_through_run_report(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    path = tmp_path / "run.jsonl"
    for step in range(3):
        model(torch.ones(1, 2)).sum().backward()
        check_step(model, step, path=path)
        model.zero_grad()
    data = _valid(run_report(read_run(path)))
    assert {"run", "rank-0", "tensors"} <= {s["id"] for s in data["sections"]}


def test_a_models_report_with_a_comparison_and_a_labs_report_validate(tmp_path):
    from safetensors.torch import save_file

    from inspector.labs import get_lab
    from inspector.report import lab_report

    loaded = load_model("sample:tiny-gpt2")
    state = {k: v.detach().clone() for k, v in loaded.model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(tmp_path / "same.safetensors"))
    data = _valid(build_report(loaded, compare_with=str(tmp_path / "same.safetensors")))
    ids = {s["id"]: s["status"] for s in data["sections"]}
    assert {"summary", "aliases", "offsets", "placement"} <= set(ids) and ids["compare"] == "ok"
    lab = get_lab("broken-tie", labs_dir="")
    labs = _valid(lab_report(lab, {}, lab.build().loaded, "Ada"))
    assert "labs" in {s["id"] for s in labs["sections"]}


def test_the_schema_still_refuses_an_unknown_section():
    data = json.loads(build_report(load_model("sample:tiny-gpt2"), ["summary"]).to_json())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**data, "sections": [{"id": "nonsense", "title": "x", "status": "ok"}]}, SCHEMA)
