"""The Training page's replay part: a run trained by ``watch --keep`` from a model file, its kept step
replayed on the model loaded in the sidebar, and the address that opens it replayed."""

from __future__ import annotations

import pytest

from inspector.__main__ import main
from tests.apptest import run_page
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


def _ops(at) -> list[list]:
    return next(d.value for d in at.dataframe if "op" in d.value.columns)[["op", "module"]].values.tolist()


def test_a_kept_step_replays_on_the_sidebar_model(trained):
    run, source = trained
    at = run_page("8_Training.py", source=source, query={"run": str(run)})
    assert not at.error, [e.value for e in at.error]
    picker = at.selectbox(key="train_replay_step")
    assert picker.options == ["step 2: nonfinite-loss at (loss), nonfinite-parameter at a.weight"]
    at.button(key="train_replay").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    verdict = at.success[0].value.replace("\\", "")  # the verdict, its Markdown escapes taken out
    assert verdict.startswith("step 2: reproduced (loss nan, recorded nan); first NaN/Inf: forward "
                              "aten.log.default in log at ")
    assert _ops(at) == [["aten.log.default", "log"]]


def test_the_address_opens_the_step_replayed(trained):
    run, source = trained
    at = run_page("8_Training.py", source=source, query={"run": str(run), "step": "2", "replay": "1"})
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert _ops(at) == [["aten.log.default", "log"]]


def test_another_model_in_the_sidebar_is_named_and_the_page_stays_usable(trained):
    run, _ = trained
    at = run_page("8_Training.py", source="sample:tiny-gpt2", query={"run": str(run)})
    at.button(key="train_replay").click().run()
    assert not at.exception
    assert [e.value.replace("\\", "") for e in at.error] == [  # the message, its Markdown escapes taken out
        "replay file run.inspect.step2.replay.safetensors holds the weights of another model "
        "('planted:build'): 4 parameter name(s) not in this model, first 'a.weight'; 16 of this model's not "
        "in the file, first 'transformer.wte.weight'. Pass the model the run trained"]
    assert at.metric  # the rest of the page is still there
