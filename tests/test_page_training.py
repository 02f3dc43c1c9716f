"""The Training page on run files written here: a file that grows between reruns, a jump to a
finding's step, an upload, a file that is no run, and the old Distributed address."""

from __future__ import annotations

import base64
import dataclasses
import json

import numpy as np
import pytest

from inspector import Finding
from inspector.watching import RunMeta, RunWriter, StepRecord, synthetic_run
from tests.apptest import run_page


@pytest.fixture(autouse=True)
def _runs_under_tmp(tmp_path, monkeypatch):
    """The server opens typed run paths only under its runs folders: here, the test's own folder."""
    monkeypatch.setenv("INSPECTOR_RUNS", str(tmp_path))

MODULES = ("embed", "blocks.0", "head")


def _record(step: int, findings: list[dict[str, str]] | None = None) -> StepRecord:
    """Module m at step s: gradient norm (s + 1) * 10**m, so step 3's head holds 4 * 100 = 400."""
    norms = np.array([(step + 1) * 10.0 ** m for m in range(len(MODULES))], dtype=np.float32)
    return StepRecord(step=step, rank=0, time=float(step), loss=1.0 / (step + 1),
                      grad_norm=float(np.sqrt((norms.astype(np.float64) ** 2).sum())),
                      module_grad_norm=norms, module_nonfinite=np.zeros(len(MODULES), np.int32),
                      param_grad_norm=norms, findings=findings or [])


@pytest.fixture
def growing(tmp_path):
    path = tmp_path / "run.inspect"
    meta = RunMeta(model="tiny", world_size=1, every=1, modules=MODULES,
                   parameters=tuple(f"{m}.weight" for m in MODULES), parameter_modules=(0, 1, 2))
    with RunWriter(path, meta) as writer:
        yield path, writer


def _figures(at) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def _array(value) -> list:
    """A plotly data array as a list (plotly sends numpy arrays as base64 typed arrays)."""
    if isinstance(value, dict) and "bdata" in value:
        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    return list(value)


def _heatmap(at) -> dict:
    return next(f["data"][0] for f in _figures(at) if f["data"] and f["data"][0]["type"] == "heatmap")


def _metrics(at) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _modules_at(at):
    heading = [s.value for s in at.subheader if s.value.startswith("Modules at step")]
    table = next(
        d.value for d in at.dataframe if "module" in d.value.columns and "grad_norm" in d.value.columns
    )
    return heading, table


def test_the_page_follows_a_file_that_grows_between_reruns(growing):
    path, writer = growing
    for step in range(3):
        writer.write([_record(step)])
    at = run_page("8_Training.py", query={"run": str(path)})
    assert not at.error, [e.value for e in at.error]
    assert _metrics(at) == {"Steps": "3", "Last step": "2", "Modules": "3", "Ranks": "1", "Findings": "0"}
    assert "Still being written" in at.caption[1].value
    heading, table = _modules_at(at)
    assert heading == ["Modules at step 2"]
    assert table.set_index("module")["grad_norm"].tolist() == [3.0, 30.0, 300.0]

    writer.write(
        [_record(3, [Finding("exploding-gradient", "warning", "head", "400 is far above").to_dict()])]
    )
    at.run()
    assert not at.exception and not at.error
    assert _metrics(at)["Last step"] == "3" and _metrics(at)["Findings"] == "1"
    heading, table = _modules_at(at)
    assert heading == ["Modules at step 3"]  # "Follow the latest step" is on by default
    assert table.set_index("module").loc["head", "grad_norm"] == 400.0
    heat = _heatmap(at)
    assert _array(heat["x"]) == [0, 1, 2, 3] and heat["y"] == list(MODULES)


def test_a_finding_takes_the_page_to_its_step(growing):
    path, writer = growing
    for step in range(6):
        fs = (
            [Finding("dead-gradient", "warning", "blocks.0", "zero for 2 steps").to_dict()]
            if step == 2
            else []
        )
        writer.write([_record(step, fs)])
    at = run_page("8_Training.py", query={"run": str(path)})
    assert _modules_at(at)[0] == ["Modules at step 5"]
    at.selectbox(key="train_jump").set_value(0).run()
    assert not at.exception
    assert at.checkbox(key="train_latest").value is False
    assert at.number_input(key="train_step").value == 2
    heading, table = _modules_at(at)
    assert heading == ["Modules at step 2"]
    assert table.set_index("module").loc["blocks.0", "grad_norm"] == 30.0
    at.number_input(key="train_step").set_value(4).run()  # any step by hand
    assert _modules_at(at)[0] == ["Modules at step 4"]


def test_an_uploaded_run_is_shown_and_a_file_that_is_no_run_is_named(tmp_path):
    path = tmp_path / "r.inspect"
    synthetic_run(path, steps=40, modules=6, world_size=2)
    at = run_page("8_Training.py")
    assert [i.value for i in at.info] == ["Choose a run file to see it."]
    at.file_uploader(key="train_upload").upload("r.inspect", path.read_bytes()).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert _metrics(at) == {"Steps": "40", "Last step": "39", "Modules": "6", "Ranks": "2", "Findings": "1"}
    assert [h.value for h in at.main.header] == ["Ranks"]  # the per-rank part of a two-rank run
    at.file_uploader(key="train_upload").upload("notes.inspect", b"not a run").run()
    assert not at.exception
    assert len(at.error) == 1 and at.error[0].value.startswith("notes.inspect ")
    assert len(at.metric) == 0


def test_ten_thousand_steps_of_a_hundred_modules_stay_a_few_hundred_cells(tmp_path):
    path = tmp_path / "long.inspect"
    synthetic_run(path, steps=10_000, modules=100, chunk=2_000)
    at = run_page("8_Training.py", query={"run": str(path)})
    assert not at.error, [e.value for e in at.error]
    assert max(len(c.proto.spec) for c in at.get("plotly_chart")) < 1_000_000
    timeline = _figures(at)[0]["data"][0]  # the explosion synthetic_run plants at step 7,500
    assert _array(timeline["x"]) == [7500] and timeline["y"] == ["exploding-gradient"]
    heat = _heatmap(at)
    # 100 modules fit (one row each); 10,000 steps in columns of ceil(10000 / 300) = 34
    assert len(heat["y"]) == 100 and _array(heat["x"])[:3] == [0, 34, 68]


def test_the_old_distributed_address_goes_to_the_training_page():
    from ui.navigation import REDIRECTS, VIEWS

    assert REDIRECTS == {"Distributed": "pages/8_Training.py"}
    assert "pages/8_Training.py" in {v.file for v in VIEWS}
    assert "Distributed" not in {v.url_path for v in VIEWS}  # the address is free for the redirect


def test_the_old_address_opened_directly_shows_the_run(growing):
    path, writer = growing
    writer.write([_record(0)])
    at = run_page("9_Distributed.py", query={"run": str(path)})
    assert not at.error and [t.value for t in at.title] == ["Training"]
    assert _metrics(at)["Steps"] == "1"


def test_a_watch_file_of_two_ranks_opens_by_path(tmp_path):
    """A watch file of several ranks lists ``distributed`` among its checks and is still an Arrow file."""
    path = tmp_path / "two.inspect"
    meta = RunMeta(model="tiny", world_size=2, every=1, modules=MODULES, checks=("nonfinite", "distributed"),
                   parameters=tuple(f"{m}.weight" for m in MODULES), parameter_modules=(0, 1, 2))
    with RunWriter(path, meta) as writer:
        for step in range(2):
            writer.write([_record(step), dataclasses.replace(_record(step), rank=1)])
    at = run_page("8_Training.py", query={"run": str(path)})
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert _metrics(at)["Ranks"] == "2" and _metrics(at)["Steps"] == "2"


def test_the_modules_table_names_its_columns_and_writes_a_non_finite_gradient_norm_as_such():
    import pandas as pd

    from ui.training import readable

    # step 10 of a run whose gate overflowed: inp's gradient held 144 NaN/Inf values, so its norm is NaN;
    # head's gradient norm was simply not taken at that step (NaN, no NaN/Inf values counted)
    frame = pd.DataFrame({"module": ["inp", "head", "gate"], "grad_norm": [np.nan, np.nan, 0.25],
                          "param_norm": [1.5, 2.0, np.nan], "nonfinite": [144.0, 0.0, 0.0]})
    table, config = readable(frame)
    assert table["grad_norm"].tolist() == ["NaN/Inf", "", "0.25"]
    # a value not taken is an empty cell, never the grid's "None" for a null
    assert table["param_norm"].tolist() == ["1.5", "2", ""]
    assert {c: config[c]["label"] for c in ("grad_norm", "param_norm", "nonfinite")} == {
        "grad_norm": "gradient norm", "param_norm": "parameter norm", "nonfinite": "NaN/Inf gradient values"}
    assert config["nonfinite"]["type_config"]["format"] == "%d"
    # a table without NaN/Inf keeps its gradient norms numeric, to four significant digits
    table, config = readable(frame.assign(grad_norm=[1.0, 2.0, 3.0], nonfinite=0.0))
    assert (
        table["grad_norm"].tolist() == [1.0, 2.0, 3.0]
        and config["grad_norm"]["type_config"]["format"] == "%.4g"
    )


def test_a_long_finding_message_is_shown_whole():
    import pandas as pd

    from ui.training import findings_layout

    found = pd.DataFrame({"step": [10], "message": ["gate produced NaN/Inf from finite inputs " * 6]})
    layout = findings_layout(found)
    assert layout["row_height"] > 66 and layout["column_config"]["message"]["width"] > 400
    assert layout["column_config"]["code"]["width"] == "medium"  # nonfinite-forward on one line
    assert findings_layout(found.assign(message="short"))["row_height"] is None


def test_the_norm_choice_and_the_heatmap_title_read_in_words(growing):
    path, writer = growing
    writer.write([_record(s) for s in range(3)])
    at = run_page("8_Training.py", query={"run": str(path)})
    assert not at.exception, [e.value for e in at.exception]
    choice = at.radio(key="train_column")
    assert choice.options[0] == "gradient norm"
    titles = [f["layout"].get("title", {}).get("text", "") for f in _figures(at)]
    assert any(t.startswith("gradient norm per module and step") for t in titles)


def test_the_page_counts_each_code_once_per_episode(growing):
    # two loss spikes (steps 1 and 4) and one dead gradient, as the watch writes them
    path, writer = growing
    spike = Finding("loss-spike", "warning", "(model)", "loss 100x its median").to_dict()
    dead = Finding("dead-gradient", "warning", "head", "zero for 5 steps").to_dict()
    for step in range(6):
        writer.write([_record(step, {1: [spike, dead], 4: [spike]}.get(step))])
    at = run_page("8_Training.py", query={"run": str(path)})
    assert not at.exception
    counts = next(d.value for d in at.dataframe if "count" in d.value.columns).set_index("code")
    assert counts["count"].to_dict() == {"loss-spike": 2, "dead-gradient": 1}
    assert (counts.loc["loss-spike", "first_step"], counts.loc["loss-spike", "last_step"]) == (1, 4)


def test_the_page_opens_with_the_first_error_and_a_button_to_its_step(growing):
    # a loss spike (warning) at step 1, the NaN producer at step 3 and the gradient it poisoned at 3 and 4
    path, writer = growing
    spike = Finding("loss-spike", "warning", "(model)", "loss 40x its median").to_dict()
    nan_grad = Finding("nonfinite-gradient", "error", "head", "gradient holds 12 NaN values").to_dict()
    producer = Finding("nonfinite-forward", "error", "blocks.0", "produced NaN from finite inputs").to_dict()
    for step in range(6):
        writer.write([_record(step, {1: [spike], 3: [nan_grad, producer], 4: [nan_grad]}.get(step))])
    at = run_page("8_Training.py", query={"run": str(path)})
    assert not at.exception and not at.error, [e.value for e in at.error]
    lines = [m.value.replace("\\", "") for m in at.markdown if "First error" in m.value]
    assert len(lines) == 1 and "step 3 · nonfinite-forward at blocks.0" in lines[0]
    assert "produced NaN from finite inputs" in lines[0] and "(2 more errors after it)" in lines[0]
    found = next(d.value for d in at.dataframe if "message" in d.value.columns)
    assert list(zip(found["step"], found["code"], strict=True)) == [
        (3, "nonfinite-forward"), (3, "nonfinite-gradient"), (4, "nonfinite-gradient"), (1, "loss-spike")]
    assert _modules_at(at)[0] == ["Modules at step 5"]
    at.button(key="train_verdict_go").click().run()
    assert not at.exception
    assert at.checkbox(key="train_latest").value is False and at.number_input(key="train_step").value == 3
    assert _modules_at(at)[0] == ["Modules at step 3"]


def test_a_run_with_only_warnings_opens_on_the_first_one_and_a_button_to_its_step(growing):
    path, writer = growing
    spike = Finding("loss-spike", "warning", "(model)", "loss 40x its median").to_dict()
    dead = Finding("dead-gradient", "warning", "head", "zero for 2 steps").to_dict()
    writer.write([_record(s, {1: [spike], 3: [dead, spike]}.get(s)) for s in range(6)])
    at = run_page("8_Training.py", query={"run": str(path)})
    said = [m.value.replace("\\", "") for m in at.markdown if "No errors" in m.value]
    assert len(said) == 1
    assert said[0].startswith(":orange[:material/warning: **No errors. First warning: step 1 ")
    assert "loss-spike at (model) — loss 40x its median (2 more warnings after it)" in said[0]
    # the first of each other kind, with its own button
    kinds = [m.value for m in at.markdown if "**dead-gradient**" in m.value]
    assert len(kinds) == 1 and kinds[0].startswith(":material/warning: step 3 · ")
    assert [b.label for b in at.button if b.key.startswith("train_verdict_go")] == ["Go to step 1", "Step 3"]
    at.button(key="train_verdict_go").click().run()
    assert not at.exception
    assert at.number_input(key="train_step").value == 1
    assert (at.query_params["step"], at.query_params["finding"]) == ("1", "1")  # the table's first finding
    heading = [s.value for s in at.subheader]
    assert heading.index("Modules at step 1") < heading.index("Findings")  # right under the verdict


def test_the_address_opens_a_step_and_a_finding(growing):
    path, writer = growing
    dead = Finding("dead-gradient", "warning", "blocks.0", "zero for 2 steps").to_dict()
    writer.write([_record(s, [dead] if s == 2 else None) for s in range(6)])
    at = run_page("8_Training.py", query={"run": str(path), "step": "4"})
    assert not at.error, [e.value for e in at.error]
    heading, table = _modules_at(at)
    assert heading == ["Modules at step 4"] and at.checkbox(key="train_latest").value is False
    assert table.set_index("module").loc["head", "grad_norm"] == 500.0  # (4 + 1) * 100
    at.number_input(key="train_step").set_value(3).run()  # by hand: the address follows
    assert at.query_params["step"] == "3" and _modules_at(at)[0] == ["Modules at step 3"]
    at.checkbox(key="train_latest").check().run()  # the latest again: the address names no step
    assert "step" not in at.query_params and _modules_at(at)[0] == ["Modules at step 5"]

    at = run_page("8_Training.py", query={"run": str(path), "finding": "1"})
    heading, table = _modules_at(at)
    assert heading == ["Modules at step 2"]
    assert table.iloc[0][["mark", "module"]].tolist() == ["dead-gradient", "blocks.0"]  # marked, on top
    at = run_page("8_Training.py", query={"run": str(path), "step": "two", "finding": "9"})
    assert [w.value for w in at.warning] == [
        "The address names finding 9; this run has 1.",
        "The address's step=two is no step number: the latest step is shown."]
    assert _modules_at(at)[0] == ["Modules at step 5"]


def test_a_real_nan_run_keeps_its_columns_marks_the_producer_and_is_followed_no_more(tmp_path):
    import torch
    from torch import nn

    from inspector import watch

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    calls = []

    def poison(module, inputs, output):  # the first Linear's output turns NaN at its 8th call (step 7)
        calls.append(1)
        return output * float("nan") if len(calls) == 8 else None

    model[0].register_forward_hook(poison)
    path = tmp_path / "nan.inspect"
    with watch(model, opt, path, nonfinite=True, update_ratio=True) as w:
        for _ in range(10):
            loss = model(torch.randn(4, 8)).pow(2).mean()
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    at = run_page("8_Training.py", query={"run": str(path)})
    assert not at.exception and not at.error, [e.value for e in at.error]
    first = next(m.value for m in at.markdown if "First error" in m.value).replace("\\", "")
    assert "step 7 · nonfinite-forward at 0 — " in first
    heat = next(f for f in _figures(at) if f["data"] and f["data"][0]["type"] == "heatmap")
    layer, star = heat["data"][1], heat["data"][2]
    assert layer["name"] == "NaN or Inf" and star["y"] == ["0"] and _array(star["x"]) == [7]
    _, table = _modules_at(at)  # step 9: every gradient NaN, no parameter norm taken, the column kept
    assert {"param_norm", "update_ratio"} <= set(table.columns) and set(table["param_norm"]) == {""}
    assert any("Not taken at this step: parameter norm" in c.value for c in at.caption)
    assert at.session_state["train_complete"] == str(path)  # complete: no fragment re-runs it any more


def test_the_step_view_marks_a_producer_without_parameters_and_the_first_nan_gradient(tmp_path):
    import torch
    from torch import nn

    from inspector import watch

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))  # "1", the ReLU, holds nothing
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    calls = []

    def poison(module, inputs, output):  # the ReLU's output turns NaN at its 4th call (step 3)
        calls.append(1)
        return output * float("nan") if len(calls) == 4 else None

    model[1].register_forward_hook(poison)
    path = tmp_path / "relu.inspect"
    with watch(model, opt, path, nonfinite=True):
        for _ in range(5):
            model(torch.randn(4, 8)).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    at = run_page("8_Training.py", query={"run": str(path)})
    assert not at.exception and not at.error, [e.value for e in at.error]
    at.button(key="train_verdict_go").click().run()
    heading, table = _modules_at(at)
    assert heading == ["Modules at step 3"]
    assert table["module"].tolist()[:2] == ["1", "0"]  # the producer, then the first NaN gradient in order
    assert table["mark"].iloc[0] == "produced the NaN/Inf (no parameters)"
    assert table["mark"].iloc[1].endswith("first NaN/Inf gradient")
    assert not table.isna().any().any()  # no cell the grid would write "None"


def test_the_verdict_box_data_lists_the_first_of_each_kind(growing):
    from inspector.watching import read_run
    from ui.training_findings import verdict_view

    path, writer = growing
    spike = Finding("loss-spike", "warning", "(model)", "loss 40x its median").to_dict()
    explode = Finding("exploding-gradient", "warning", "head", "1000x its median").to_dict()
    frozen = Finding("frozen-parameters", "info", "embed", "embed.weight does not require grad").to_dict()
    writer.write([_record(s, {0: [frozen], 4: [spike], 7: [explode], 9: [spike]}.get(s)) for s in range(10)])
    view = verdict_view(read_run(path))
    assert view.severity == "warning" and (view.first.step, view.first.code) == (4, "loss-spike")
    assert view.line == ("No errors. First warning: step 4 · loss-spike at (model) — loss 40x its median "
                         "(2 more warnings after it)")
    # most severe first, then by step: spike 4 (row 0), explosion 7 (row 1), spike 9 (row 2), the information
    assert [(i, f.code, f.step) for i, f in view.kinds] == [
        (0, "loss-spike", 4), (1, "exploding-gradient", 7), (3, "frozen-parameters", 0)]


def test_the_run_report_downloads_in_every_format(growing):
    import os

    path, writer = growing
    spike = Finding("loss-spike", "warning", "(model)", "loss 40x its median").to_dict()
    writer.write([_record(s, [spike] if s == 1 else None) for s in range(3)])
    at = run_page("8_Training.py", query={"run": str(path)})
    labels = [b.proto.label.split(" ")[0] for b in at.get("download_button")]
    pdf = ["PDF"] if os.access("/usr/bin/chromium", os.X_OK) else []  # made by Report.to_pdf when pressed
    assert labels == ["HTML", "JSON", "Markdown", *pdf]
