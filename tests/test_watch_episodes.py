"""Findings that recur: a second loss spike, a second gradient explosion and a second non-finite
batch are reported at the step each begins; one that has not cleared long enough is not."""

from __future__ import annotations

import math

import torch
from torch import nn

from inspector import read_run, watch
from inspector.watching import finding_counts, first_findings


def _spiky_run(path, spikes: set[int], *, steps: int = 30, **options):
    """nn.Linear(2, 1) with weight (1, 1), bias 0 and SGD lr 0 (nothing changes): on x = (1, 1), y = 0 the
    loss (w.x + b - y)^2 is 4 at every step and the weight's gradient 2 * 2 * x = (4, 4), norm 5.657.
    At a spike step the loss is multiplied by 100: loss 400 (100x the median 4, over loss_factor 3 and over
    the noise, 0 here) and gradient norm 565.7 (100x its median): one loss-spike, which takes in the
    gradient of the model's one module. Nothing is judged before step 10, nor in the 5 steps after a spike."""
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.bias.zero_()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = torch.ones(1, 2), torch.zeros(1, 1)
    with watch(model, opt, path, **options) as w:
        for step in range(steps):
            loss = ((model(x) - y) ** 2).mean() * (100.0 if step in spikes else 1.0)
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return w.result


def _steps(found, code: str) -> list[int]:
    return [f.step for f in found if f.code == code]


def test_spikes_at_steps_12_and_25_are_both_listed(tmp_path):
    result = _spiky_run(tmp_path / "r.inspect", {12, 25})
    assert _steps(result.findings, "loss-spike") == [12, 25]
    assert _steps(result.findings, "exploding-gradient") == []  # one cause, one finding
    assert all("gradient grew about 100x" in f.message for f in result.findings if f.code == "loss-spike")
    assert {f.where for f in result.findings if f.code == "loss-spike"} == {"(model)"}
    run = read_run(tmp_path / "r.inspect")  # the file holds both, and the report's list shows both
    assert _steps(run.findings, "loss-spike") == [12, 25]
    assert _steps(first_findings(run), "loss-spike") == [12, 25]
    counts = finding_counts(run).set_index("code")
    assert counts.loc["loss-spike", "count"] == 2 and "exploding-gradient" not in counts.index
    assert (counts.loc["loss-spike", "first_step"], counts.loc["loss-spike", "last_step"]) == (12, 25)


def test_a_spike_back_before_it_cleared_is_the_same_episode(tmp_path):
    # with recur_after = 8, spikes at 12 and 18: 18 - 12 = 6 steps, not more than 8, so one episode;
    # 18 and 27: 9 steps apart, a new one (each is judged: more than 5 steps after the one before)
    result = _spiky_run(tmp_path / "r.inspect", {12, 18, 27}, steps=35, recur_after=8)
    assert _steps(result.findings, "loss-spike") == [12, 27]
    # with recur_after 2, 12 and 18 are two episodes as well
    result = _spiky_run(tmp_path / "s.inspect", {12, 18, 27}, steps=35, recur_after=2)
    assert _steps(result.findings, "loss-spike") == [12, 18, 27]


def test_a_second_non_finite_batch_is_a_second_finding(tmp_path):
    # no optimizer (w.step() ends a step), so the NaN gradients of a bad batch never reach the weights:
    # the batches of steps 3 and 15 are the only producers
    model = nn.Linear(2, 1)
    with watch(model, None, tmp_path / "r.inspect", nonfinite=True) as w:
        for step in range(20):
            model(torch.ones(1, 2) * (math.nan if step in (3, 15) else 1.0)).sum().backward()
            w.step()
            model.zero_grad()
    assert [(f.step, f.where) for f in w.result.findings if f.code == "nonfinite-forward"] == [
        (3, "(batch)"), (15, "(batch)")]
    assert _steps(w.result.findings, "nonfinite-gradient") == []  # watch names producers, not victims


def test_a_finding_that_fires_once_stays_once(tmp_path):
    # not-in-optimizer holds at every step, and is a "once" code: listed at step 0 only
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for _ in range(12):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
            opt.zero_grad()
    assert sorted(_steps(w.result.findings, "not-in-optimizer")) == [0, 0]  # 1.weight and 1.bias
