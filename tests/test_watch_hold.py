"""The run file's steps held back: the watch writes them as one record batch at most half a second late,
and at once when a reader must see them (a finding, a stop, a failure, the end)."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch
from torch import nn

from inspector import watch
from inspector.watching import RunMeta, RunWriter, StepRecord, read_run

HOLD_PROMISED = 0.5  # docs/training.md: a step reaches the file within 0.5 s


def _meta() -> RunMeta:
    return RunMeta("tiny", 1, 1, ("m0",), ("m0.weight",), (0,))


def _record(step: int) -> StepRecord:
    norms = np.full(1, step, dtype=np.float32)
    return StepRecord(step=step, rank=0, time=100.0 + step, lr=[0.1], module_grad_norm=norms,
                      module_nonfinite=np.zeros(1, np.int32), param_grad_norm=norms)


def _steps(path) -> list[int]:
    return read_run(path).steps["step"].tolist()


def _wait_for(path, steps: list[int], seconds: float) -> float:
    """Seconds until a reader of ``path`` sees ``steps`` (fails after ``seconds``)."""
    start = time.perf_counter()
    while _steps(path) != steps:
        assert time.perf_counter() - start < seconds, f"{_steps(path)} after {seconds} s, not {steps}"
        time.sleep(0.02)
    return time.perf_counter() - start


def test_held_steps_reach_the_file_within_the_hold_also_when_nothing_more_is_written(tmp_path):
    path = tmp_path / "h.inspect"
    with RunWriter(path, _meta(), hold=0.3, hold_steps=100) as w:
        for step in range(3):
            w.write([_record(step)])
        assert _steps(path) == []  # held: no batch yet
        waited = _wait_for(path, [0, 1, 2], seconds=5.0)  # the writer's thread writes them
        assert waited <= 0.3 + 2.0  # the hold, and room for a loaded machine
        w.write([_record(3)], now=True)  # a step a reader must see: at once, after the held ones
        assert _steps(path) == [0, 1, 2, 3]
        w.write([_record(4)])
    assert _steps(path) == [0, 1, 2, 3, 4] and read_run(path).complete  # close writes what is held
    assert not [t for t in threading.enumerate() if t.name.startswith("run writer")]  # its thread ended


def test_hold_steps_writes_a_batch_of_that_many_steps(tmp_path):
    path = tmp_path / "n.inspect"
    with RunWriter(path, _meta(), hold=60.0, hold_steps=4) as w:
        for step in range(6):
            w.write([_record(step)])
        assert _steps(path) == [0, 1, 2, 3] and w.steps_written == 4  # one batch of 4; 4 and 5 held
        w.flush()
        assert _steps(path) == list(range(6)) and w.steps_written == 6


def test_without_a_hold_each_write_is_on_disk_at_once(tmp_path):
    path = tmp_path / "z.inspect"
    with RunWriter(path, _meta()) as w:
        w.write([_record(0)])
        assert _steps(path) == [0]
        assert not [t for t in threading.enumerate() if t.name.startswith("run writer")]


def _model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def _step(model, opt, w, loss_scale: float = 1.0) -> None:
    loss = model(torch.randn(8, 4)).pow(2).mean() * loss_scale
    loss.backward()
    w.log(loss=loss)
    opt.step()
    opt.zero_grad()


def test_a_live_reader_sees_a_healthy_step_within_the_hold_and_a_finding_at_once(tmp_path):
    model, opt = _model()
    path = tmp_path / "live.inspect"
    with watch(model, opt, path) as w:
        for _ in range(3):
            _step(model, opt, w)
        _wait_for(path, [0, 1, 2], seconds=HOLD_PROMISED + 2.0)  # the loop paused: the steps arrive anyway
        _step(model, opt, w)  # held again
        _step(model, opt, w, loss_scale=float("nan"))  # step 4: nonfinite-loss, on disk when the step ends
        run = read_run(path)
        assert run.steps["step"].tolist() == [0, 1, 2, 3, 4]  # with the step held before it
        assert (4, "nonfinite-loss") in [(f.step, f.code) for f in run.findings]
        assert {f.step for f in run.findings} == {4}
        _step(model, opt, w)
    run = read_run(path)
    assert run.complete and run.steps["step"].tolist() == list(range(6))


def test_a_held_step_is_in_the_file_when_the_block_raises(tmp_path):
    model, opt = _model()
    path = tmp_path / "raised.inspect"
    try:
        with watch(model, opt, path) as w:
            _step(model, opt, w)
            _step(model, opt, w)
            raise KeyboardInterrupt  # Ctrl-C between steps
    except KeyboardInterrupt:
        pass
    run = read_run(path)
    assert run.steps["step"].tolist()[:2] == [0, 1]
    assert [f.code for f in run.findings] == ["run-failed"]


def test_close_while_the_writers_thread_is_flushing_ends_it(tmp_path):
    """close() during the writer thread's own flush (which clears the wake-up close() set): the thread
    still ends and close() returns, with every step on disk."""
    path = tmp_path / "c.inspect"
    w = RunWriter(path, _meta(), hold=0.05, hold_steps=100)
    w.write([_record(0)])
    with w._lock:  # the writer's thread, done waiting its hold, blocks in its flush
        time.sleep(0.3)
        closer = threading.Thread(target=w.close)
        closer.start()
        time.sleep(0.2)  # close() has set its wake-up and waits for the thread
    closer.join(timeout=5.0)
    hung = closer.is_alive()
    if hung:  # let both threads end before failing
        w._due.set()
        closer.join(timeout=5.0)
    assert not hung
    assert _steps(path) == [0] and read_run(path).complete
