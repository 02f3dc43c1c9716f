"""The Compare page: B from a path beside the loaded model (findings first, chart, tensors), two runs."""

from __future__ import annotations

import pytest
from apptest import run_page
from safetensors.torch import save_file

from inspector import load_model


@pytest.fixture(autouse=True)
def _runs_under_tmp(tmp_path, monkeypatch):
    """The server opens typed run paths only under its runs folders: here, the test's own folder."""
    monkeypatch.setenv("INSPECTOR_RUNS", str(tmp_path))


def test_weights_against_a_fine_tuned_checkpoint(tmp_path):
    state = {k: v.detach().clone() for k, v in load_model("sample:tiny-gpt2").model.state_dict().items()
             if k != "lm_head.weight"}
    state["transformer.h.0.mlp.c_fc.weight"] += 0.1
    save_file(state, str(tmp_path / "ft.safetensors"))
    at = run_page("9_Compare.py", source="sample:tiny-gpt2")
    assert any("Give B" in i.value for i in at.info)
    at.text_input(key="cmp_b").input(str(tmp_path / "ft.safetensors")).run()
    assert not at.exception, [e.value for e in at.exception]
    # lm_head.weight is tied to the embedding, which the file holds: stored once, not missing
    assert [m.value for m in at.metric] == ["16", "1", "15", "0 / 0"]
    findings = at.dataframe[0].value
    # one layer: every unchanged tensor's kind is unchanged, a frozen set (info), summed up in one line
    # and c_fc.weight + 0.1 everywhere is a rank-1 change (0.1 times a matrix of ones)
    assert set(findings["code"]) == {"unchanged-expected", "tie-stored-once", "low-rank-update"}
    assert any(c.value.startswith("1 of 16 tensors changed; 15 unchanged") for c in at.caption)
    assert len(at.get("plotly_chart")) == 1
    tensors = at.dataframe[-1].value
    assert tensors["name"].tolist() == ["transformer.h.0.mlp.c_fc.weight", "lm_head.weight"]
    assert tensors["status"].tolist() == ["changed", "stored-once"]
    # the side that lacks the tensor shows empty cells, never "None"
    assert tensors.iloc[1][["shape_a", "shape_b", "dtype_b"]].tolist() == ["(32, 16)", "", ""]


def test_a_missing_b_is_an_error_not_a_crash():
    at = run_page("9_Compare.py", source="sample:tiny-gpt2", query={"b": "/nowhere/b.safetensors"})
    assert any("does not exist" in e.value for e in at.error)


def test_two_runs(tmp_path):
    from test_compare_runs import write_run

    a, b = write_run(tmp_path / "a.inspect"), write_run(tmp_path / "b.inspect", part_at=6)
    at = run_page("9_Compare.py", source="sample:tiny-gpt2", query={"run_a": a, "run_b": b})
    at.radio(key="cmp_mode").set_value("two run files").run()
    assert not at.exception, [e.value for e in at.exception]
    assert [m.value for m in at.metric] == ["10", "6", "1"]
    assert [m.label for m in at.metric][2] == "Modules that part first"
    assert [s.value for s in at.subheader] == ["Per module", "Per step", "Runs side by side"]
    assert len(at.get("plotly_chart")) == 1


def test_the_run_tables_are_labelled_short_enough_to_fit():
    import pandas as pd

    from ui.compare_view import run_module_config, run_step_config

    steps = pd.DataFrame(columns=["step", "loss_a", "loss_b", "loss_diff", "grad_norm_a", "grad_norm_b",
                                  "grad_norm_diff"])
    labels = {c: v["label"] for c, v in run_step_config(steps).items()}
    assert labels == {"loss_a": "loss A", "loss_b": "loss B", "loss_diff": "loss rel. diff",
                      "grad_norm_a": "grad norm A", "grad_norm_b": "grad norm B",
                      "grad_norm_diff": "grad norm rel. diff"}
    assert "max(|A|, |B|)" in run_step_config(steps)["grad_norm_diff"]["help"]
    # a wide table leaves its last columns blank in the grid: every label stays under 25 characters
    assert max(len(v["label"]) for v in run_module_config().values()) < 25


def test_a_run_that_went_nan_is_marked_and_no_difference_reads_infinity(tmp_path):
    import numpy as np

    from inspector.watching import RunMeta, RunWriter, StepRecord

    def write(path, nan_from=None):
        meta = RunMeta(model="m", world_size=1, every=1, modules=("a", "b"), parameters=("a.w", "b.w"),
                       parameter_modules=(0, 1))
        with RunWriter(path, meta) as w:
            for s in range(10):
                bad = nan_from is not None and s >= nan_from
                g = np.array([np.nan, np.nan] if bad else [1.0, 2.0], np.float32)
                w.write([StepRecord(step=s, rank=0, time=float(s), loss=float("nan") if bad else 1.0,
                                    grad_norm=float("nan") if bad else 2.0, nonfinite=4 if bad else 0,
                                    module_grad_norm=g, module_nonfinite=np.array([2, 2] if bad else [0, 0],
                                                                                  np.int32),
                                    param_grad_norm=g)])
        return str(path)

    a, b = write(tmp_path / "a.inspect"), write(tmp_path / "b.inspect", nan_from=6)
    at = run_page("9_Compare.py", source="sample:tiny-gpt2", query={"run_a": a, "run_b": b})
    at.radio(key="cmp_mode").set_value("two run files").run()
    assert not at.exception, [e.value for e in at.exception]
    chart = next(c for c in at.get("plotly_chart") if "Two runs" in c.proto.spec)
    import json

    spec = json.loads(chart.proto.spec)
    marks = [t for t in spec["data"] if t.get("name", "").endswith("NaN/Inf")]
    assert len(marks) == 2 and all(t["x"] == [6] for t in marks)  # B, on the loss and the norm panels
    bands = [s for s in spec["layout"]["shapes"] if s["type"] == "rect"]
    assert [(s["x0"], s["x1"]) for s in bands] == [(5.5, 9.5)] * 2  # one band on each panel
    modules = next(d.value for d in at.dataframe if "max_diff" in d.value.columns)
    assert set(modules["max_diff"]) == {"NaN/Inf on one side"}
    steps = next(d.value for d in at.dataframe if "loss_diff" in d.value.columns)
    assert steps["loss_diff"].tolist() == ["0"] * 6 + ["NaN/Inf on one side"] * 4
    assert not any("inf" == str(v).lower() for v in steps.to_numpy().ravel())


def test_the_tensor_table_leads_with_what_changed():
    import pandas as pd

    from ui.compare_view import tensor_rows

    cols = ["name", "name_b", "status", "module", "shape_a", "shape_b", "dtype_a", "dtype_b", "device_a",
            "device_b", "numel", "rel_change", "max_abs"]
    frame = pd.DataFrame([["w", "w", "changed", "m", (2,), (2,), "float32", "float32", "cpu", "cpu", 2, 0.5,
                           1.0]], columns=cols)
    assert tensor_rows(frame).columns[:4].tolist() == ["name", "status", "rel_change", "max_abs"]


def test_a_merged_low_rank_update_is_named_first_with_its_rank(tmp_path):
    import json

    import torch

    state = {k: v.detach().clone() for k, v in load_model("sample:tiny-gpt2").model.state_dict().items()
             if k != "lm_head.weight"}
    torch.manual_seed(0)
    w = state["transformer.h.0.attn.c_attn.weight"]  # (48, 16) += (48, 2) @ (2, 16): a merged rank-2 adapter
    state["transformer.h.0.attn.c_attn.weight"] = w + 0.05 * torch.randn(48, 2) @ torch.randn(2, 16)
    save_file(state, str(tmp_path / "merged.safetensors"))
    merged = str(tmp_path / "merged.safetensors")
    at = run_page("9_Compare.py", source="sample:tiny-gpt2", query={"b": merged})
    assert not at.exception and not at.error, [e.value for e in at.error]
    said = [m.value.replace("\\", "") for m in at.markdown if "Changed:" in m.value]
    assert len(said) == 1 and "Changed: transformer.h.0.attn.c_attn.weight (‖B−A‖/‖A‖ " in said[0]
    assert said[0].endswith(", rank-2 update)**]")
    assert any("**low-rank-update**: rank-2 update on 1 matrices" in i.value for i in at.info)
    bars = json.loads(at.get("plotly_chart")[0].proto.spec)
    colours = {t["name"]: t["marker"]["color"] for t in bars["data"]}
    # one colour per trace, so each legend entry shows the colour of its own bars and marks
    assert set(colours) == {"changed", "bitwise unchanged"}
    assert all(isinstance(c, str) for c in colours.values())
    assert colours["changed"] != colours["bitwise unchanged"]
    changed = next(t for t in bars["data"] if t["name"] == "changed")
    assert changed["x"] == ["transformer.h.0.attn.c_attn"]
    # in model order
    assert bars["layout"]["xaxis"]["categoryarray"][:2] == ["transformer.wte", "transformer.wpe"]


def test_two_runs_name_the_module_that_went_non_finite_first(tmp_path):
    import numpy as np

    from inspector import Finding
    from inspector.watching import RunMeta, RunWriter, StepRecord

    def write(path, nan_from=None):
        meta = RunMeta(model="m", world_size=1, every=1, modules=("a", "b"), parameters=("a.w", "b.w"),
                       parameter_modules=(0, 1))
        with RunWriter(path, meta) as w:
            for s in range(10):
                bad = nan_from is not None and s >= nan_from
                g = np.array([np.nan, np.nan] if bad else [1.0, 2.0], np.float32)
                found = [Finding("nonfinite-gradient", "error", "a.w", "NaN gradient").to_dict(),
                         Finding("nonfinite-forward", "error", "gate", "produced NaN").to_dict()] \
                    if s == nan_from else []
                w.write([StepRecord(step=s, rank=0, time=float(s), loss=1.0, grad_norm=float(g.sum()),
                                    nonfinite=4 if bad else 0, module_grad_norm=g, param_grad_norm=g,
                                    module_nonfinite=np.array([2, 2] if bad else [0, 0], np.int32),
                                    findings=found)])
        return str(path)

    a, b = write(tmp_path / "a.inspect"), write(tmp_path / "b.inspect", nan_from=6)
    at = run_page("9_Compare.py", source="sample:tiny-gpt2", query={"run_a": a, "run_b": b})
    at.radio(key="cmp_mode").set_value("two run files").run()
    assert not at.exception, [e.value for e in at.exception]
    said = [m.value.replace("\\", "") for m in at.markdown if "went non-finite at step" in m.value]
    assert len(said) == 1  # only B did; the producer (a module without parameters) named, not a.w
    assert "b.inspect went non-finite at step 6: gate — produced NaN/Inf from finite inputs" in said[0]
    listed = [m.value for m in at.markdown if m.value.startswith("Modules beyond the tolerance")]
    assert len(listed) == 1 and "a run went non-finite there, so every module parts" in listed[0]
