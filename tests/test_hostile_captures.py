"""A run's captures file is untrusted like the run file: forged metadata (a ``skipped``, ``step``, ``rank``
or ``module`` that is not what the watch writes) or tensor names are refused with an InspectorError naming
the file, from ``read_captures``, ``Run.captures``, the report (an error section; the rest stands) and the
Hook captures page (an error box, no exception)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from streamlit.testing.v1 import AppTest

from inspector import InspectorError
from inspector.__main__ import main
from inspector.watching import RunMeta, RunWriter, StepRecord, captures_path, read_captures, read_run

GOOD_SKIPPED = json.dumps([{"module": "1", "kind": "input", "path": "", "bytes": 64, "reason": "budget"}])
GOOD = {"format": "inspector-watch-captures", "module": "1", "step": "2", "rank": "0",
        "skipped": GOOD_SKIPPED}
TENSORS = {"input/0": torch.ones(2, 3), "output/0": torch.full((2, 3), float("inf"))}

FORGED = [
    ("skipped-int", {"skipped": "5"}, {}, "skipped is not a list .* \\(a JSON int\\)"),
    ("skipped-items", {"skipped": "[1, 2]"}, {}, "entry 0 is not an object"),
    ("skipped-types", {"skipped": json.dumps([{"module": 1, "kind": "output", "path": "", "bytes": "9",
                                               "reason": "x"}])}, {}, "entry 0 is not an object"),
    ("skipped-extra", {"skipped": json.dumps([{"module": "1", "kind": "output", "path": "", "bytes": 9,
                                               "reason": "x", "evil": 1}])}, {}, "entry 0 is not an object"),
    ("skipped-not-json", {"skipped": "[{"}, {}, "skipped is not a list .* \\(not JSON\\)"),
    ("skipped-deep", {"skipped": "[" * 100_000 + "]" * 100_000}, {}, "skipped is not a list"),
    ("step-text", {"step": "abc"}, {}, "step is 'abc', not a whole number"),
    ("step-digits", {"step": "9" * 5000}, {}, "step is '9999.*, not a whole number"),
    ("rank-negative", {"rank": "-1"}, {}, "rank is '-1', not a whole number from 0"),
    ("module-missing", {"module": None}, {}, "names no module"),
    ("module-empty", {"module": ""}, {}, "names no module"),
    ("key-other", {}, {"evil": torch.zeros(1)}, "holds a tensor named 'evil'"),
    ("key-gap", {}, {"input/2": torch.zeros(1)}, "input tensors are not numbered 0, 1, 2"),
    ("key-huge-index", {}, {"output/99999999999": torch.zeros(1)}, "holds a tensor named 'output/9999"),
]


def _run_with(folder, meta_changes: dict, extra_tensors: dict):
    folder.mkdir(parents=True, exist_ok=True)
    run = folder / "run.inspect"
    meta = RunMeta(model="m", world_size=1, every=1, modules=("0", "1"), parameters=("0.w",),
                   parameter_modules=(0,))
    with RunWriter(run, meta) as w:
        w.write([StepRecord(step=s, rank=0, time=0.0, loss=1.0) for s in range(3)])
    metadata = {k: v for k, v in {**GOOD, **meta_changes}.items() if v is not None}
    save_file({**TENSORS, **extra_tensors}, str(captures_path(run)), metadata=metadata)
    return run


def test_a_good_captures_file_reads(tmp_path):
    caps = read_captures(_run_with(tmp_path, {}, {}))
    assert caps.order == ["1"] and caps._state == {"step": 2, "rank": 0}
    assert [s.bytes for s in caps.skipped] == [64] and torch.isinf(caps.outputs["1"]).all()


@pytest.mark.parametrize("case, meta, tensors, message", FORGED, ids=[c[0] for c in FORGED])
def test_a_forged_captures_file_is_refused_naming_it(tmp_path, case, meta, tensors, message):
    run = _run_with(tmp_path, meta, tensors)
    pattern = "run.inspect.captures.safetensors: .*" + message
    with pytest.raises(InspectorError, match=pattern):
        read_captures(run)
    with pytest.raises(InspectorError, match=pattern):
        read_run(run).captures  # noqa: B018 - the property reads the file


def test_the_report_says_the_captures_are_damaged_and_keeps_the_rest(tmp_path, capsys):
    run = _run_with(tmp_path, {"skipped": "5", "step": "x"}, {})
    out = tmp_path / "report.json"
    assert main(["report", str(run), "--format", "json", "-o", str(out)]) == 0
    sections = {s["id"]: s for s in json.loads(out.read_text())["sections"]}
    assert sections["captures"]["status"] == "error"
    assert "run.inspect.captures.safetensors" in sections["captures"]["note"]
    assert sections["run"]["status"] == "ok"
    assert "Traceback" not in capsys.readouterr().err


def _page(p: str) -> None:
    import streamlit as st

    from ui.run_captures import run_captures_section

    st.session_state.setdefault("cap_run_path", p)
    run_captures_section()


def test_the_hook_captures_page_shows_an_error_box(tmp_path, monkeypatch):
    run = _run_with(tmp_path, {"skipped": json.dumps([{"module": []}])}, {})
    monkeypatch.setenv("INSPECTOR_RUNS", str(tmp_path))
    at = AppTest.from_function(_page, args=(str(run),), default_timeout=60).run()
    assert not at.exception
    assert "run.inspect.captures.safetensors" in at.error[0].value and "skipped" in at.error[0].value


def test_a_capture_whose_output_the_budget_left_out_shows_without_charts(tmp_path, monkeypatch):
    run = tmp_path / "run.inspect"
    _run_with(tmp_path, {}, {})
    save_file({"input/0": torch.ones(2, 3)}, str(captures_path(run)), metadata=GOOD)
    monkeypatch.setenv("INSPECTOR_RUNS", str(tmp_path))
    at = AppTest.from_function(_page, args=(str(run),), default_timeout=60).run()
    assert not at.exception and not at.error
    assert any("left it out" in c.value for c in at.caption)
