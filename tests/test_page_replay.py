"""A kept step replayed in the dashboard: "Replay this step" on each of the Training page's error findings at
a kept step opens the Hook captures page with "Step N, replayed" (the op and its line, the module outputs with
NaN/Inf marked, the producer's inputs, reproduced or not); its address opens it too. The run is trained by
``watch --keep`` from a model file; the step replays on the model loaded in the sidebar."""

from __future__ import annotations

import pytest

from inspector.__main__ import main
from tests.apptest import run_in_app, run_page
from tests.test_replay_cli import PLANTED


@pytest.fixture
def trained(tmp_path, monkeypatch):
    """run.inspect of 4 steps of planted.py, whose third batch makes log(-0.5) in module ``log``."""
    monkeypatch.setenv("INSPECTOR_RUNS", str(tmp_path))
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    (tmp_path / "planted.py").write_text(PLANTED)
    run = tmp_path / "run.inspect"
    assert main(["watch", f"{tmp_path / 'planted.py'}:build", "--steps", "4", "--keep", "--optimizer", "sgd",
                 "-o", str(run)]) == 0
    return run, f"{tmp_path / 'planted.py'}:build"


def _frame(at, column: str):
    return next(d.value for d in at.dataframe if column in d.value.columns)


def _log_line(run) -> str:
    """``planted.py:N`` of the line that makes the NaN."""
    lines = (run.parent / "planted.py").read_text().splitlines()
    return f"{run.parent / 'planted.py'}:{next(i for i, t in enumerate(lines, 1) if 'torch.log(' in t)}"


def _assert_replayed(at, run) -> None:
    """The "Step 2, replayed" view: reproduced, the op table, the outputs marked, the producer's inputs."""
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert "Step 2, replayed" in [s.value for s in at.subheader]
    verdict = at.success[0].value.replace("\\", "")  # the verdict, its Markdown escapes taken out
    assert verdict.startswith("step 2: reproduced (loss nan, recorded nan); first NaN/Inf: forward "
                              "aten.log.default in log at ")
    assert next(m.value for m in at.metric if m.label == "Reproduced") == "yes"
    ops = _frame(at, "op")
    assert ops[["op", "module", "line"]].values.tolist()[0] == ["aten.log.default", "log", _log_line(run)]
    outputs = _frame(at, "marked")
    marked = dict(zip(outputs["module"], outputs["marked"], strict=True))
    assert marked["log"] == "NaN/Inf" and marked["a"] == "NaN/Inf"  # the NaN and the module after it
    inputs = next(d.value for d in at.dataframe
                  if "kind" in d.value.columns and set(d.value["kind"]) == {"input"})
    assert inputs["module"].tolist() == ["log"] and inputs["marked"].tolist() == [""]  # finite: -1 everywhere
    assert inputs[["min", "max"]].values.tolist() == [[-1.0, -1.0]]
    assert at.selectbox(key="replayed_module").value == "log"  # its output's heatmap, NaN cells marked


def test_each_error_finding_at_a_kept_step_opens_the_hook_captures_page_replayed(trained):
    run, source = trained
    at = run_in_app("8_Training.py", source=source, query={"run": str(run)})
    assert [b.label for b in at.button if b.key.startswith("train_replay")] == ["Replay this step"] * 2
    at.button(key="train_replay_0").click().run()
    assert [t.value for t in at.title] == ["Hook captures"]
    assert at.query_params == {"run": str(run), "step": "2", "replay": "1"}  # its address, to share
    _assert_replayed(at, run)


def test_the_training_page_address_with_replay_goes_to_the_hook_captures_page(trained):
    run, source = trained
    at = run_in_app("8_Training.py", source=source, query={"run": str(run), "step": "2", "replay": "1"})
    assert [t.value for t in at.title] == ["Hook captures"]
    _assert_replayed(at, run)


def test_the_address_opens_the_step_replayed_on_the_hook_captures_page(trained):
    run, source = trained
    at = run_page("4_Hook_captures.py", source=source, query={"run": str(run), "step": "2", "replay": "1"})
    _assert_replayed(at, run)
    at.selectbox(key="replayed_module").set_value("b").run()  # another module: the replay is not run again
    assert not at.exception and at.selectbox(key="replayed_module").value == "b"


def test_the_training_page_on_its_own_shows_the_replay_where_it_is(trained):
    run, source = trained
    at = run_page("8_Training.py", source=source, query={"run": str(run)})
    at.button(key="train_replay_1").click().run()  # no navigation to switch to: shown on this page
    _assert_replayed(at, run)


def test_a_step_not_kept_and_a_run_outside_the_runs_are_named(trained, tmp_path_factory):
    run, source = trained
    at = run_page("4_Hook_captures.py", source=source, query={"run": str(run), "step": "3", "replay": "1"})
    assert [e.value.replace("\\", "") for e in at.error] == [
        "step 3 of run.inspect was not kept with its weights; its replay files hold steps 1 (no weights), 2. "
        "A finding after the update needs keep_weights=True"]
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "run.inspect"
    at = run_page("4_Hook_captures.py", source=source,
                  query={"run": str(elsewhere), "step": "2", "replay": "1"})
    assert len(at.error) == 1 and "--runs" in at.error[0].value
    at = run_page("4_Hook_captures.py", source=source, query={"run": str(run), "step": "two", "replay": "1"})
    assert "no step number" in at.warning[0].value


def test_another_model_in_the_sidebar_is_named_and_the_page_stays_usable(trained):
    run, _ = trained
    at = run_page("4_Hook_captures.py", source="sample:tiny-gpt2",
                  query={"run": str(run), "step": "2", "replay": "1"})
    assert [e.value.replace("\\", "") for e in at.error] == [  # the message, its Markdown escapes taken out
        "replay file run.inspect.step2.replay.safetensors holds the weights of another model "
        "('planted:build'): 4 parameter name(s) not in this model, first 'a.weight'; 16 of this model's not "
        "in the file, first 'transformer.wte.weight'. Pass the model the run trained"]
    assert at.metric  # the page's own capture of the sidebar model is still there


def test_a_finding_on_another_rank_replays_that_ranks_kept_step():
    from inspector.watching import StepFinding
    from ui.replays import replay_address, replayable

    nan1 = StepFinding(3, 1, "nonfinite-loss", "error", "(loss)", "rank 1's loss is NaN")
    grad0 = StepFinding(3, 0, "nonfinite-gradient", "error", "(model)", "the reduction spread it")
    whole = StepFinding(3, None, "replica-drift", "error", "w", "about the whole world")
    # rank 1 kept step 3, rank 0 did not: only rank 1's finding (and none of rank 0's) is replayable there
    assert replayable({(3, 1)}, [nan1, grad0, whole]) == [nan1]
    assert replayable({(3, 0)}, [nan1, grad0, whole]) == [grad0, whole]
    assert replay_address("r.inspect", 3, 1) == {"run": "r.inspect", "step": "3", "replay": "1", "rank": "1"}
    assert replay_address("r.inspect", 3) == {"run": "r.inspect", "step": "3", "replay": "1"}
