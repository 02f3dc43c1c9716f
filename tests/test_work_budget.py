"""A wall budget bounds the library's long work: comparing checkpoints and runs, a report, JSON lines.

Each test runs real work under :func:`inspector.utils.work_budget` and checks that it stops early (the
budget spent, or ``stop_if`` giving a reason) with a message naming the work, and that without a budget,
or with one that is not spent, the result is the same as before.
"""

from __future__ import annotations

import threading

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from inspector import InspectorError, build_report, compare, load_model
from inspector.utils import WorkStopped, check_budget, work_budget
from inspector.watching import read_run, synthetic_run


def _checkpoints(tmp_path, n: int = 40):
    a = {f"layer{i}.weight": torch.randn(8, 8) for i in range(n)}
    b = {k: v + (0.5 if i % 2 else 0.0) for i, (k, v) in enumerate(a.items())}
    save_file(a, str(tmp_path / "a.safetensors"))
    save_file(b, str(tmp_path / "b.safetensors"))
    return str(tmp_path / "a.safetensors"), str(tmp_path / "b.safetensors")


class _Asked:
    """A ``stop_if`` that gives a reason from its ``after``-th call on; counts its calls."""

    def __init__(self, after: int | None) -> None:
        self.after, self.calls = after, 0

    def __call__(self) -> str | None:
        self.calls += 1
        return "the browser session has gone" if self.after is not None and self.calls >= self.after else None


def test_a_compare_stops_at_the_check_after_its_session_goes(tmp_path):
    a, b = _checkpoints(tmp_path)
    whole = _Asked(None)
    with work_budget(60, stop_if=whole, poll_seconds=0):
        result = compare(a, b)
    assert whole.calls > 40  # one check per tensor at least: the compare was asked all along
    assert result.tensors.equals(compare(a, b).tensors)  # a budget not spent changes nothing

    gone = _Asked(5)
    said = r"^comparing stopped after \d+\.\d s: the browser session has gone$"
    with pytest.raises(WorkStopped, match=said), \
            work_budget(60, stop_if=gone, poll_seconds=0, what="comparing"):
        compare(a, b)
    assert gone.calls == 5  # stopped at the check that heard it, not at the end


def test_a_compare_of_runs_past_its_wall_budget_stops_with_what_to_do(tmp_path):
    a, b = tmp_path / "a.inspect", tmp_path / "b.inspect"
    synthetic_run(a, steps=200, modules=20, seed=0)
    synthetic_run(b, steps=200, modules=20, seed=1)
    with pytest.raises(WorkStopped) as stopped, \
            work_budget(1e-9, what="comparing the two runs", advice="Try less."):
        compare(a, b)
    assert str(stopped.value).startswith("comparing the two runs stopped after ")
    assert str(stopped.value).endswith("it ran past its wall budget of 1e-09 s. Try less.")
    assert isinstance(stopped.value, InspectorError)  # every page and command shows it like any other
    assert compare(a, b).first_divergence is not None  # without a budget: the whole answer


def test_a_report_stops_between_its_sections():
    loaded = load_model("sample:cnn-bn")
    before = {k: v.clone() for k, v in loaded.model.state_dict().items()}
    asked = _Asked(2)
    with pytest.raises(WorkStopped, match="the report stopped"), \
            work_budget(60, stop_if=asked, poll_seconds=0, what="the report"):
        build_report(loaded, sections=["summary", "aliases", "offsets", "placement"])
    assert asked.calls == 2
    assert all(torch.equal(before[k], v) for k, v in loaded.model.state_dict().items())  # model unchanged


def test_json_lines_are_read_within_the_budget(tmp_path):
    line = '{"format":"inspector-distributed","step":%d,"world_size":1,"ranks":[],"tensors":[],"global":{}}\n'
    path = tmp_path / "steps.jsonl"
    path.write_text("".join(line % s for s in range(5000)))
    asked = _Asked(2)
    with pytest.raises(WorkStopped, match="reading stopped"), \
            work_budget(60, stop_if=asked, poll_seconds=0, what="reading"):
        read_run(path)
    assert asked.calls == 2  # checked every 1,024 lines, stopped at the second check
    assert read_run(path).check_run.findings == []  # without a budget: read to the end


def test_no_budget_no_stop_and_another_thread_is_not_bound():
    check_budget()  # outside any budget: nothing
    seen: list[BaseException | None] = []

    def other() -> None:
        try:
            check_budget()
            seen.append(None)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            seen.append(exc)

    with work_budget(1e-9, what="this request"):
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        with pytest.raises(WorkStopped, match="this request stopped"):
            check_budget()
    assert seen == [None]  # a thread has its own context: another session's work is never stopped
    check_budget()  # the budget ended with its block


@pytest.mark.parametrize("seconds", [0, -1, float("nan")])
def test_a_budget_that_is_not_a_positive_number_is_refused(seconds):
    with pytest.raises(InspectorError, match="a work budget must be a positive number of seconds"), \
            work_budget(seconds):
        pass


def test_budgets_nest_and_the_inner_one_ends_with_its_block():
    with work_budget(60, what="outer"):
        with pytest.raises(WorkStopped, match="inner stopped"), work_budget(1e-9, what="inner"):
            check_budget()
        check_budget()  # the outer one is not spent
    model = nn.Linear(2, 2)
    assert not model._forward_hooks  # nothing was hooked to do it
