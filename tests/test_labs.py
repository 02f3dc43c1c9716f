"""Labs: every checker accepts a right answer and rejects wrong ones; discovery from a folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from inspector.labs import (
    CheckResult,
    Field,
    Lab,
    LabError,
    TaskRecord,
    discover_labs,
    get_lab,
    grade,
    hints_to_show,
    lab_done,
    lab_report_markdown,
    lab_results,
    load_lab_file,
    parse_pairs,
    record_attempt,
    teacher_unlocked,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "examples" / "lab_frozen_head.py"
PACKAGE_LABS = ["broken-tie", "shifted-offsets", "stranded-buffer", "corrupted-capture",
                "flattening-myths", "find-the-op", "late-overflow", "silent-block", "stalled-schedule"]

_SCENARIOS: dict[str, object] = {}


def scenario(lab_id: str):
    """One scenario per lab for the whole file (checkers never change it)."""
    if lab_id == "corrupted-capture":
        pytest.importorskip("inspector.capture")
    if lab_id not in _SCENARIOS:
        _SCENARIOS[lab_id] = get_lab(lab_id, labs_dir="").build()
    return _SCENARIOS[lab_id]


def check(lab_id: str, task_id: str, answers: dict) -> CheckResult:
    return grade(get_lab(lab_id, labs_dir=""), task_id, scenario(lab_id), answers)


# ----------------------------------------------------------------------------- discovery

def test_package_labs_in_order_without_a_folder(monkeypatch):
    monkeypatch.delenv("INSPECTOR_LABS_DIR", raising=False)
    entries = discover_labs()
    assert [e.id for e in entries] == PACKAGE_LABS
    assert all(isinstance(e, Lab) for e in entries)


def test_a_lab_dropped_into_the_folder_appears(tmp_path, monkeypatch):
    (tmp_path / "lab_frozen_head.py").write_text(EXAMPLE.read_text())
    monkeypatch.setenv("INSPECTOR_LABS_DIR", str(tmp_path))
    entries = discover_labs()
    assert [e.id for e in entries] == [*PACKAGE_LABS, "frozen-head"]
    lab = get_lab("frozen-head")
    assert lab.source == str((tmp_path / "lab_frozen_head.py").resolve())


def test_broken_lab_files_give_one_error_each_and_the_rest_loads(tmp_path, monkeypatch):
    (tmp_path / "a_good.py").write_text(EXAMPLE.read_text())
    (tmp_path / "b_syntax.py").write_text("def oops(:\n")
    (tmp_path / "c_raises.py").write_text("raise RuntimeError('teacher typo')\n")
    (tmp_path / "d_empty.py").write_text("X = 1\n")
    (tmp_path / "e_exit.py").write_text("import sys\nsys.exit(3)\n")
    (tmp_path / "f_bad_lab.py").write_text(
        "from inspector.labs import Lab\nLAB = Lab('bad id!', 't', 's', lambda: None, ())\n")
    (tmp_path / "g_duplicate.py").write_text(EXAMPLE.read_text())
    (tmp_path / "_helper.py").write_text("raise RuntimeError('never imported')\n")
    monkeypatch.setenv("INSPECTOR_LABS_DIR", str(tmp_path))
    entries = discover_labs()
    labs = [e.id for e in entries if isinstance(e, Lab)]
    errors = {e.id: e.message for e in entries if isinstance(e, LabError)}
    assert labs == [*PACKAGE_LABS, "frozen-head"]
    assert sorted(errors) == ["b_syntax", "c_raises", "d_empty", "e_exit", "f_bad_lab", "frozen-head"]
    assert "SyntaxError" in errors["b_syntax"]
    assert "teacher typo" in errors["c_raises"]
    assert "defines no LAB" in errors["d_empty"]
    assert "SystemExit" in errors["e_exit"]
    assert "bad id!" in errors["f_bad_lab"]
    assert "already used" in errors["frozen-head"] and "g_duplicate.py" in errors["frozen-head"]


def test_a_lab_file_that_changes_torch_settings_leaves_them_as_they_were(tmp_path):
    (tmp_path / "lab_dtype.py").write_text(
        EXAMPLE.read_text()
        + "\nimport torch\ntorch.set_default_dtype(torch.float64)\ntorch.set_grad_enabled(False)\n"
    )
    (tmp_path / "lab_dtype_fails.py").write_text(
        "import torch\ntorch.set_default_dtype(torch.float64)\nraise RuntimeError('late')\n")
    entries = discover_labs(labs_dir=str(tmp_path))
    assert "frozen-head" in [e.id for e in entries if isinstance(e, Lab)]
    assert any(isinstance(e, LabError) and "late" in e.message for e in entries)
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()


def test_labs_dir_that_is_not_a_folder_is_one_error(tmp_path):
    entries = discover_labs(labs_dir=str(tmp_path / "missing"))
    assert [e.id for e in entries if isinstance(e, Lab)] == PACKAGE_LABS
    assert [type(e).__name__ for e in entries[len(PACKAGE_LABS):]] == ["LabError"]


def test_get_lab_names_the_known_labs():
    with pytest.raises(ValueError, match="no lab 'nope'; labs: broken-tie"):
        get_lab("nope", labs_dir="")


# ----------------------------------------------------------------------------- checkers

# (lab, task, wrong answers): each must fail. The lab's own solution must pass.
WRONG = [
    ("broken-tie", "name-group", {"names": ["lm_head.weight"], "code": "tie-broken", "count": 4592}),
    ("broken-tie", "name-group", {"names": ["transformer.wte.weight", "lm_head.weight"],
                                  "code": "tie-weakened", "count": 4592}),
    # 4080 is the count before the conversion; after it the 32x16 matrix counts twice: 4592
    ("broken-tie", "name-group", {"names": ["transformer.wte.weight", "lm_head.weight"],
                                  "code": "tie-broken", "count": "4080"}),
    ("broken-tie", "retie", {"replace": "lm_head.weight", "keep": "lm_head.weight"}),
    ("broken-tie", "retie", {"replace": "transformer.wpe.weight", "keep": "transformer.wte.weight"}),
    # trainable-only vector: layers.1.lora_B.weight is [80, 112); 100 -> element 20 -> (10, 0).
    # The full map's answer (layers.0.base.weight[12, 4]) is the teammate's mistake.
    ("shifted-offsets", "locate", {"parameter": "layers.0.base.weight", "element": "(12, 4)"}),
    ("shifted-offsets", "locate", {"parameter": "layers.1.lora_B.weight", "element": "(0, 10)"}),
    # full start 496 - trainable start 80 = 416 (= 128 + 16 + 256 + 16 frozen elements)
    ("shifted-offsets", "shift", {"shift": 496, "reason": "frozen parameters come before it in "
                                  "parameters(), so the full map counts them"}),
    ("shifted-offsets", "shift", {"shift": 416, "reason": "buffers are counted in the full map"}),
    ("stranded-buffer", "missing", {"names": ["block.scale"]}),
    ("stranded-buffer", "missing", {"names": ["block.scale", "block.pos_table", "head.bias"]}),
    # accelerate's own map: check_device_map rejects it (block.scale, block.pos_table unplaced)
    ("stranded-buffer", "fix-map", {"device_map": json.dumps(
        {"embed": "cpu", "block.fc1": "cpu", "block.fc2": "disk", "block.fc3": "disk", "head": "disk"})}),
    ("corrupted-capture", "corrupted", {"modules": ["conv1"]}),
    ("corrupted-capture", "corrupted", {"modules": ["conv1", "bn2", "relu1"]}),
    ("corrupted-capture", "culprits", {"pairs": "conv1 -> relu2\nbn2 -> relu1"}),
    ("corrupted-capture", "culprits", {"pairs": "conv1 -> relu1"}),
    ("flattening-myths", "shares-memory", {"verdict": "true", "changed": 0}),
    ("flattening-myths", "shares-memory", {"verdict": "false", "changed": 12}),
    ("flattening-myths", "skips-frozen", {"verdict": "true", "elements": 636}),
    # 152 is the trainable-only length; parameters() also yields the 484 frozen elements
    ("flattening-myths", "skips-frozen", {"verdict": "false", "elements": 152}),
    # the square root of a zero spread is finite (0): the division 0 / 0 makes the NaN
    ("find-the-op", "op", {"op": "aten.sqrt.default", "line": "line 53: return centred / spread.sqrt()"}),
    ("find-the-op", "op", {"op": "aten.div.Tensor",
                           "line": "line 52: spread = centred.pow(2).mean(-1, keepdim=True)"}),
    # head only passes the gate's NaN on; step 11 is when inp, given NaN weights, produces too
    ("late-overflow", "producer", {"module": "head", "step": 10}),
    ("late-overflow", "producer", {"module": "gate", "step": 11}),
    ("late-overflow", "fix", {"fix": "lower the learning rate tenfold"}),
    ("late-overflow", "fix", {"fix": "clip every gradient value to ±1"}),  # the overflow is in the forward
    ("late-overflow", "producer", {"module": "inp", "step": 10}),  # upstream: its output is still finite
    # blocks.0 is the block left out of the optimizer; 8416 = 32 + 32 + 4096 + 128 + 4096 + 32
    ("silent-block", "which", {"module": "blocks.1", "elements": 8416}),
    ("silent-block", "which", {"module": "blocks.0", "elements": 8384}),  # without the LayerNorm
    ("silent-block", "why", {"reason": "frozen: its parameters have requires_grad=False"}),
    ("silent-block", "why", {"reason": "no gradient reaches it: it is cut off from the loss"}),
    # every learning rate is 0 from step 8 (total = 8: one epoch); the watch says no-update at step 9
    ("stalled-schedule", "stopped", {"step": 9}),
    ("stalled-schedule", "stopped", {"step": 7}),
    # 3 epochs x 8 batches = 24 steps; 16 still stalls (at step 16), 100 never reaches 0
    ("stalled-schedule", "why", {"reason": "the schedule's decay ends after one epoch: every learning rate "
                                           "is 0 from then on", "total": 16}),
    ("stalled-schedule", "why", {"reason": "the schedule's decay ends after one epoch: every learning rate "
                                           "is 0 from then on", "total": 100}),
    ("stalled-schedule", "why", {"reason": "the gradients vanished: there was nothing left to learn from",
                                 "total": 24}),
]
SOLVED = sorted({(lab, task) for lab, task, _ in WRONG})


def test_every_task_of_every_package_lab_is_covered():
    tasks = {(lab.id, t.id) for lab in discover_labs(labs_dir="") for t in lab.tasks}
    assert tasks == set(SOLVED)


@pytest.mark.parametrize(("lab_id", "task_id"), SOLVED)
def test_checker_accepts_the_solution(lab_id, task_id):
    lab = get_lab(lab_id, labs_dir="")
    sc = scenario(lab_id)
    result = grade(lab, task_id, sc, lab.task(task_id).solution_for(sc))
    assert result.passed, result.message
    assert result.evidence


@pytest.mark.parametrize(("lab_id", "task_id", "answers"), WRONG)
def test_checker_rejects_a_wrong_answer(lab_id, task_id, answers):
    result = check(lab_id, task_id, answers)
    assert not result.passed
    assert result.message


def test_broken_tie_is_really_broken_and_either_direction_reties():
    sc = scenario("broken-tie")
    model = sc.model
    assert model.lm_head.weight is not model.transformer.wte.weight
    assert sum(p.numel() for p in model.parameters()) == 4592
    result = check("broken-tie", "retie", {"replace": "transformer.wte.weight", "keep": "lm_head.weight"})
    assert result.passed
    assert any("4080" in e for e in result.evidence)
    # the checker re-ties a copy: the student's scenario stays broken
    assert model.lm_head.weight is not model.transformer.wte.weight


def test_shifted_offsets_gradient_is_nan_where_the_trainable_map_says():
    sc = scenario("shifted-offsets")
    assert torch.isnan(sc.model.layers[1].lora_B.weight.grad[10, 0])
    assert int(torch.isnan(torch.cat([p.grad.flatten() for p in sc.model.parameters()
                                      if p.grad is not None])).sum()) == 1


def test_stranded_buffer_map_checker_uses_accelerate_and_the_audit():
    sc = scenario("stranded-buffer")
    acc = dict(sc.extras["device_map"])
    # accelerate splits block: fc1 on cpu, fc2/fc3 on disk, and leaves block's buffers out
    assert acc == {"embed": "cpu", "block.fc1": "cpu", "block.fc2": "disk", "block.fc3": "disk",
                   "head": "disk"}
    rejected = check("stranded-buffer", "fix-map", {"device_map": json.dumps(acc)})
    assert not rejected.passed and "check_device_map" in rejected.evidence[0]
    on_cpu = check("stranded-buffer", "fix-map",
                   {"device_map": json.dumps({**acc, "block.scale": "cpu", "block.pos_table": "cpu"})})
    assert not on_cpu.passed and "buffer-stranded" in on_cpu.evidence[1]
    on_disk = check("stranded-buffer", "fix-map",
                    {"device_map": json.dumps({**acc, "block.scale": "disk", "block.pos_table": "disk"})})
    assert on_disk.passed, on_disk.message
    bad_json = check("stranded-buffer", "fix-map", {"device_map": "{'embed': 'cpu'"})
    assert not bad_json.passed and bad_json.message.startswith("Device map (JSON): not valid JSON")


def test_every_view_of_the_package_labs_builds():
    for lab in discover_labs(labs_dir=""):
        if lab.id == "corrupted-capture" and not _has_capture():
            continue
        sc = scenario(lab.id)
        for view in lab.views:
            assert view.build(sc) is not None, (lab.id, view.title)


def _has_capture() -> bool:
    try:
        import inspector.capture  # noqa: F401
    except ImportError:
        return False
    return True


# ----------------------------------------------------------------------------- grading plumbing

def test_answers_are_parsed_and_bad_ones_explained():
    assert Field("n", "Count", "number").parse(" 4,592 ") == 4592
    assert Field("m", "Names", "multi").parse("a, b\nc") == ["a", "b", "c"]
    assert parse_pairs("conv1 -> relu1; bn2: relu2") == {"conv1": "relu1", "bn2": "relu2"}
    result = check("broken-tie", "name-group", {"names": ["lm_head.weight"], "code": "tie-broken",
                                                "count": "many"})
    assert (
        not result.passed
        and result.message == "Elements in parameters() now: give a whole number, not 'many'"
    )
    empty = check("broken-tie", "retie", {"replace": "", "keep": None})
    assert not empty.passed and empty.message.startswith("Answer every field first")


def test_progress_hints_and_report():
    lab = get_lab("broken-tie", labs_dir="")
    task = lab.task("name-group")
    progress: dict[str, dict[str, TaskRecord]] = {}
    wrong = {"names": ["lm_head.weight"], "code": "tie-broken", "count": 4592}
    rec = record_attempt(progress, lab.id, task.id, wrong, check(lab.id, task.id, wrong))
    assert (rec.attempts, rec.passed) == (1, False)
    assert hints_to_show(task, rec) == task.hints[:1]
    record_attempt(progress, lab.id, task.id, wrong, check(lab.id, task.id, wrong))
    assert hints_to_show(task, rec) == task.hints[:2]
    right = task.solution_for(scenario(lab.id))
    record_attempt(progress, lab.id, task.id, right, check(lab.id, task.id, right))
    assert (rec.attempts, rec.passed, hints_to_show(task, rec)) == (3, True, ())
    assert lab_done(lab, progress) == 1
    res = lab_results(lab, progress, "Ada")
    assert [t["passed"] for t in res["tasks"]] == [True, False]
    md = lab_report_markdown(lab, progress, "Ada | <b>")
    assert "# Lab report: The broken tie" in md and "Tasks passed: **1 of 2**" in md
    assert "Ada \\| &lt;b&gt;" in md and "| count | 4592 |" in md


def test_lab_report_through_the_report_module_validates():
    jsonschema = pytest.importorskip("jsonschema")
    from inspector.report import lab_report, load_schema

    lab = get_lab("broken-tie", labs_dir="")
    report = lab_report(lab, {}, scenario(lab.id).loaded, "Ada")
    data = json.loads(report.to_json())
    jsonschema.validate(data, load_schema())
    labs = report.section("labs")
    assert labs.facts == {"lab": "broken-tie", "title": "The broken tie", "student": "Ada",
                          "tasks": 2, "passed": 0}
    assert [f.code for f in labs.findings] == ["lab-task-open", "lab-task-open"]
    assert "## Lab results" in report.to_markdown()


def test_teacher_key():
    assert teacher_unlocked("k", {"INSPECTOR_TEACHER_KEY": "k"})
    assert not teacher_unlocked("K", {"INSPECTOR_TEACHER_KEY": "k"})
    assert not teacher_unlocked("", {"INSPECTOR_TEACHER_KEY": ""})
    assert not teacher_unlocked("k", {})


def test_the_documented_example_lab_grades_with_gradient_norms():
    [lab] = load_lab_file(EXAMPLE)
    sc = lab.build()
    assert grade(lab, "frozen", sc, {"names": ["fc.weight", "fc.bias"]}).passed
    assert not grade(lab, "frozen", sc, {"names": ["conv1.weight", "conv1.bias"]}).passed


def test_a_lab_file_runs_again_only_when_it_changes(tmp_path):
    path = tmp_path / "counter.py"
    body = (EXAMPLE.read_text()
            + "\nimport builtins\nbuiltins._lab_runs = getattr(builtins, '_lab_runs', 0) + 1\n")
    path.write_text(body)
    import builtins
    builtins._lab_runs = 0
    try:
        assert [lab.title for lab in load_lab_file(path)] == ["The frozen head"]
        load_lab_file(path)
        assert builtins._lab_runs == 1
        path.write_text(body.replace('title="The frozen head"', 'title="The frozen classifier"'))
        assert [lab.title for lab in load_lab_file(path)] == ["The frozen classifier"]
        assert builtins._lab_runs == 2
    finally:
        del builtins._lab_runs


def test_a_helper_beside_a_lab_file_is_imported_and_its_edit_shows_without_a_restart(tmp_path):
    import os
    import sys

    (tmp_path / "_helpers.py").write_text("TITLE = 'The frozen head'\n")
    (tmp_path / "lab_helped.py").write_text(EXAMPLE.read_text() + "\nimport dataclasses\n"
                                            "from _helpers import TITLE\n"
                                            "LAB = dataclasses.replace(LAB, title=TITLE)\n")
    assert [lab.title for lab in discover_labs(labs_dir=str(tmp_path)) if lab.id == "frozen-head"] == [
        "The frozen head"]
    helper = tmp_path / "_helpers.py"
    helper.write_text("TITLE = 'The frozen classifier'\n")
    os.utime(helper, ns=(helper.stat().st_atime_ns, helper.stat().st_mtime_ns + 10**9))  # a later edit
    assert [lab.title for lab in discover_labs(labs_dir=str(tmp_path)) if lab.id == "frozen-head"] == [
        "The frozen classifier"]
    assert str(tmp_path) not in sys.path
    sys.modules.pop("_helpers", None)


def test_the_teachers_guide_lists_every_shipped_lab_and_the_view_options():
    guide = (ROOT / "docs" / "teachers.md").read_text(encoding="utf-8")
    lines = guide.splitlines()
    start = lines.index("| Lab | What breaks | Graded with |") + 2
    table = lines[start:lines.index("", start)]
    listed = [line.split("|")[1].strip() for line in table]
    assert listed == [lab.title for lab in discover_labs(labs_dir="")]
    for needed in ("after=", "INSPECTOR_MODEL_DIRS", "What needs a restart", "labs collect"):
        assert needed in guide, needed
