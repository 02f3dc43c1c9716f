"""Labs count fairly: every task's grader holds the story's constraints, answers stay off the screen
until their task is answered, an incomplete answer is no attempt, and the report keeps the pass."""

from __future__ import annotations

import json

import pytest

from inspector.labs import (
    TaskRecord,
    discover_labs,
    get_lab,
    grade,
    hints_to_show,
    lab_report_markdown,
    lab_results,
    read_results,
    record_attempt,
    results_document,
)
from tests.lab_giveaways import GIVEAWAYS, given_away, view_text

LABS = [lab.id for lab in discover_labs(labs_dir="")]
_SCENARIOS: dict[str, object] = {}


def scenario(lab_id: str):
    """One scenario per lab for the whole file (checkers and views never change it)."""
    if lab_id not in _SCENARIOS:
        _SCENARIOS[lab_id] = get_lab(lab_id, labs_dir="").build()
    return _SCENARIOS[lab_id]


# ----------------------------------------------------------------------------- the story's constraints

# split-block, float32 bytes: embed 16,640, block.fc1/fc2/fc3 16,640 each, block.scale 256, block.pos_table
# 4,096, head 2,080: 72,992 in all. The story's laptop has 50,000 bytes of CPU and offloads the rest to disk;
# accelerate fitted embed + block.fc1 = 33,280 on the CPU.
ACCELERATE = {"embed": "cpu", "block.fc1": "cpu", "block.fc2": "disk", "block.fc3": "disk", "head": "disk"}

# (lab, task, answers, what the story says that this answer ignores): a trivial or off-story answer each.
SCHEDULE = "the schedule's decay ends after one epoch: every learning rate is 0 from then on"
ALL_TENSORS = ["embed.weight", "embed.bias", "block.scale", "block.pos_table", "block.fc1.weight",
               "block.fc1.bias", "block.fc2.weight", "block.fc2.bias", "block.fc3.weight", "block.fc3.bias",
               "head.weight", "head.bias"]
# the lines a student picks from
FIND_THE_OP_LINES = next(f for t in get_lab("find-the-op", labs_dir="").tasks for f in t.fields
                         if f.key == "line").options_for(scenario("find-the-op"))
TRIVIAL = [
    ("broken-tie", "name-group",
     {"names": ["transformer.wte.weight", "lm_head.weight", "transformer.wpe.weight"], "code": "tie-broken",
      "count": 4592}, "one group, not every name that looks tied"),
    ("broken-tie", "retie", {"replace": "transformer.ln_f.weight", "keep": "transformer.h.0.ln_1.weight"},
     "a tie between two other same-shape tensors leaves the embedding untied (4576 elements)"),
    ("shifted-offsets", "locate", {"parameter": "layers.1.lora_B.weight", "element": "(10, 0, 0)"},
     "the element of a 2-d tensor has two indices"),
    ("shifted-offsets", "shift", {"shift": 416, "reason": "a tied weight is counted twice in the full map"},
     "the model has no tie: the reason must fit the maps"),
    ("stranded-buffer", "missing", {"names": ALL_TENSORS}, "every tensor, placed or not"),
    # the whole model on the CPU: 72,992 bytes, over the story's 50,000
    ("stranded-buffer", "fix-map", {"device_map": json.dumps({"": "cpu"})}, "the CPU budget"),
    # the whole model on disk fits disk's budget, but offloads what fits on the CPU
    ("stranded-buffer", "fix-map", {"device_map": json.dumps({"": "disk"})},
     "offload only what does not fit"),
    # a device the laptop does not have
    ("stranded-buffer", "fix-map",
     {"device_map": json.dumps({**ACCELERATE, "block.scale": "cuda:0", "block.pos_table": "cuda:0"})},
     "the devices"),
    # the buffers with the block's smaller part, on the CPU (33,280 + 4,352 fits, but strands them)
    ("stranded-buffer", "fix-map",
     {"device_map": json.dumps({**ACCELERATE, "block.scale": "cpu", "block.pos_table": "cpu"})},
     "buffers stranded"),
    ("corrupted-capture", "corrupted", {"modules": ["conv1", "relu1", "conv2", "bn2", "relu2", "pool", "fc"]},
     "every module, trusted captures too"),
    ("corrupted-capture", "culprits", {"pairs": "conv1 -> relu1\nbn2 -> relu2\nconv2 -> bn2"},
     "conv2's capture is intact: only corrupted captures"),
    ("flattening-myths", "shares-memory", {"verdict": "false", "changed": 12},
     "what the experiment measured"),
    ("flattening-myths", "skips-frozen", {"verdict": "false", "elements": 0}, "the length of the vector"),
    # the square root that takes the 0 is not the op that makes the NaN (sqrt(0) = 0)
    ("find-the-op", "op", {"op": "aten.sqrt.default", "line": FIND_THE_OP_LINES[-1]},
     "the first op whose inputs were finite and whose output was not"),
    ("late-overflow", "producer", {"module": "(model)", "step": 0},
     "the first step and a module, not the model"),
    ("late-overflow", "fix", {"fix": "clip every gradient value to ±1"},
     "the overflow is in the forward pass"),
    ("silent-block", "which", {"module": "blocks.0", "elements": 0}, "how many elements never changed"),
    ("silent-block", "why", {"reason": "the fine-tuned weights of that block were never saved"},
     "the evidence: the block is trainable, has gradients, and no group holds it"),
    ("stalled-schedule", "stopped", {"step": 0}, "the step the weights stopped moving, not the first"),
    ("stalled-schedule", "why", {"reason": SCHEDULE, "total": 10**6},
     "a decay that never reaches 0 is not the story's schedule, which ends with the training"),
]


def trivial(lab_id: str, task_id: str) -> dict:
    """The first trivial answer of the table for the task."""
    return next(a for lab, task, a, _ in TRIVIAL if (lab, task) == (lab_id, task_id))


def test_every_task_has_a_trivial_answer_that_fails():
    tasks = {(lab.id, t.id) for lab in discover_labs(labs_dir="") for t in lab.tasks}
    assert tasks == {(lab, task) for lab, task, _, _ in TRIVIAL}


@pytest.mark.parametrize(("lab_id", "task_id", "answers", "story"), TRIVIAL)
def test_a_trivial_or_off_story_answer_fails(lab_id, task_id, answers, story):
    result = grade(get_lab(lab_id, labs_dir=""), task_id, scenario(lab_id), answers)
    assert not result.passed, story
    assert result.counted and result.message  # a complete answer, graded and counted


def test_the_stranded_buffer_map_names_the_budget_it_breaks():
    lab = get_lab("stranded-buffer", labs_dir="")
    sc = scenario(lab.id)
    whole = grade(lab, "fix-map", sc, {"device_map": json.dumps({"": "cpu"})})
    assert whole.message == ("The map does not fit the story's budget: cpu would hold 72,992 bytes, "
                             "over its 50,000.")
    lazy = grade(lab, "fix-map", sc, {"device_map": json.dumps({"": "disk"})})
    assert "the CPU holds 0 bytes where accelerate fitted 33,280" in lazy.message
    # another right map than the planner's: head joins the CPU (33,280 + 2,080 = 35,360 bytes)
    fits = grade(lab, "fix-map", sc, {"device_map": json.dumps(
        {"embed": "cpu", "block.fc1": "cpu", "head": "cpu", "block": "disk"})})
    assert fits.passed, fits.message
    assert fits.evidence[-1] == "bytes per device: cpu 35,360, disk 37,632"


# ----------------------------------------------------------------------------- incomplete answers

def _incomplete(lab_id: str) -> list[tuple[str, dict]]:
    """(task, answers) for every task: its solution with one field left empty, one case per field."""
    lab = get_lab(lab_id, labs_dir="")
    out = []
    for task in lab.tasks:
        solution = task.solution_for(scenario(lab_id))
        for f in task.fields:
            out.append((task.id, {**solution, f.key: [] if f.kind == "multi" else ""}))
    return out


@pytest.mark.parametrize("lab_id", LABS)
def test_an_incomplete_answer_is_no_attempt_and_shows_no_hint(lab_id):
    lab = get_lab(lab_id, labs_dir="")
    progress: dict[str, dict[str, TaskRecord]] = {}
    for task_id, answers in _incomplete(lab_id):
        wrong = trivial(lab_id, task_id)
        first = record_attempt(progress, lab_id, task_id, wrong, grade(lab, task_id, scenario(lab_id), wrong))
        assert first is not None and first.attempts == 1
        hints = hints_to_show(lab.task(task_id), first)
        result = grade(lab, task_id, scenario(lab_id), answers)
        assert not result.passed and not result.counted, (task_id, answers)
        assert result.message.startswith("Answer every field first")
        assert record_attempt(progress, lab_id, task_id, answers, result) is None
        rec = progress[lab_id][task_id]
        assert (rec.attempts, rec.answers, hints_to_show(lab.task(task_id), rec)) == (1, wrong, hints)
        del progress[lab_id][task_id]


def test_an_unreadable_number_is_no_attempt_either():
    lab = get_lab("silent-block", labs_dir="")
    result = grade(lab, "which", scenario(lab.id), {"module": "blocks.0", "elements": "many"})
    assert (result.passed, result.counted) == (False, False)
    assert result.message == "Elements that never changed: give a whole number, not 'many'"


# ----------------------------------------------------------------------------- answers kept off the screen

def _open_views(lab_id: str, passed: set[str]):
    lab = get_lab(lab_id, labs_dir="")
    return [v for v in lab.views if not v.after or v.after in passed]


def test_every_task_says_what_would_give_it_away_and_every_lock_names_a_task():
    labs = discover_labs(labs_dir="")
    assert {(lab.id, t.id) for lab in labs for t in lab.tasks} == set(GIVEAWAYS)
    for lab in labs:
        assert {v.after for v in lab.views} <= {"", *(t.id for t in lab.tasks)}, lab.id


@pytest.mark.parametrize(("lab_id", "task_id"), sorted(GIVEAWAYS))
def test_no_view_open_before_a_task_is_answered_shows_its_answer(lab_id, task_id):
    lab = get_lab(lab_id, labs_dir="")
    order = [t.id for t in lab.tasks]
    passed = set(order[:order.index(task_id)])  # the tasks before it answered, this one not yet
    for view in _open_views(lab_id, passed):  # on-demand views included: a student can press them
        found = given_away(view_text(view.build(scenario(lab_id))), lab_id, task_id)
        assert not found, (view.title, found)
    shut = [v.title.lower() for v in lab.views if v.after and v.after not in passed]
    for hint in lab.task(task_id).hints:  # a hint points only at what is open on this page
        text = hint.lower()
        assert " page" not in text, hint  # another page cannot open the lab's model
        assert not [t for t in shut if t in text or ("findings" in t and "findings" in text)], hint


# The labs whose first screen gave Task 1 away before the locks: once every task is answered, the views
# that were locked do show it (so the check above is one that can fail).
LOCKED = ["broken-tie", "shifted-offsets", "stranded-buffer", "corrupted-capture", "late-overflow",
          "silent-block", "stalled-schedule"]


@pytest.mark.parametrize("lab_id", LOCKED)
def test_the_locked_views_are_what_hides_the_first_answer(lab_id):
    lab = get_lab(lab_id, labs_dir="")
    every = _open_views(lab_id, {t.id for t in lab.tasks})
    text = "\n".join(view_text(v.build(scenario(lab_id))) for v in every)
    assert given_away(text, lab_id, lab.tasks[0].id)


# ----------------------------------------------------------------------------- the report keeps the pass

@pytest.mark.parametrize("lab_id", LABS)
def test_the_report_keeps_the_passing_answer_after_a_later_wrong_try(lab_id):
    lab = get_lab(lab_id, labs_dir="")
    task = lab.tasks[0]
    sc = scenario(lab_id)
    wrong = trivial(lab_id, task.id)
    right = task.solution_for(sc)
    progress: dict[str, dict[str, TaskRecord]] = {}
    for answers in (wrong, right, wrong):
        record_attempt(progress, lab_id, task.id, answers, grade(lab, task.id, sc, answers))
    rec = progress[lab_id][task.id]
    assert (rec.attempts, rec.passed, rec.last_passed, rec.passed_attempts) == (3, True, False, 2)
    first = lab_results(lab, progress, "Ada")["tasks"][0]
    assert (first["passed"], first["later"]) == (True, 1)
    assert first["answers"] == json.loads(json.dumps(right))
    assert first["message"] == grade(lab, task.id, sc, right).message
    md = lab_report_markdown(lab, progress, "Ada", environ={"INSPECTOR_TEACHER_KEY": "chalk"})
    assert "## Task 1: passed" in md and "| field | passing answer |" in md
    assert "1 later check(s) after the pass" in md
    assert grade(lab, task.id, sc, wrong).message not in md.split("<!-- inspector-lab-results")[0]
    back = read_results(md, "report.md", environ={"INSPECTOR_TEACHER_KEY": "chalk"})
    assert back.status == "signed" and back.student == "Ada"
    assert back.progress() == progress


def test_a_results_file_round_trip_and_what_breaks_its_checksum():
    lab = get_lab("broken-tie", labs_dir="")
    progress: dict[str, dict[str, TaskRecord]] = {}
    right = lab.tasks[0].solution_for(scenario(lab.id))
    record_attempt(progress, lab.id, "name-group", right, grade(lab, "name-group", scenario(lab.id), right))
    key = {"INSPECTOR_TEACHER_KEY": "chalk"}
    doc = results_document(discover_labs(labs_dir=""), progress, "Ada", environ=key)
    assert list(doc["labs"]) == ["broken-tie"]  # only the labs tried
    text = json.dumps(doc)
    assert read_results(text, environ=key).status == "signed"
    assert read_results(text, environ={}).status == "unverifiable"
    assert read_results(text, environ={"INSPECTOR_TEACHER_KEY": "other"}).status == "tampered"
    doc["labs"]["broken-tie"]["tasks"]["name-group"]["attempts"] = 0
    assert read_results(json.dumps(doc), environ=key).status == "tampered"
    plain = results_document([lab], progress, "Ada", environ={})
    assert read_results(json.dumps(plain), environ={}).status == "checksum"
    with pytest.raises(ValueError, match="not a lab results file"):
        read_results('{"a": 1}', "notes.json")
    with pytest.raises(ValueError, match="notes.md holds no lab results"):
        read_results("# my notes", "notes.md")


def test_the_labs_over_a_watched_run_leave_no_folder_behind(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # every temporary folder goes here
    for lab_id in ("late-overflow", "stalled-schedule"):
        lab = get_lab(lab_id, labs_dir="")
        sc = lab.build()
        for view in lab.views:  # the run, its findings and the producer's copy were read whole
            assert len(view.build(sc)), (lab_id, view.title)
        fix = lab.tasks[1]
        assert grade(lab, fix.id, sc, fix.solution_for(sc)).passed  # trains again, in a folder of its own
    left = [p.name for p in tmp_path.iterdir() if not p.name.startswith("torchinductor")]  # torch's own cache
    assert left == []
