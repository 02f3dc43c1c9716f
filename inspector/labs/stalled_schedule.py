"""Lab: the stalled schedule — a watched run that silently stops learning after its first epoch."""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..loading.models import LoadedModel
from .core import CheckResult, Field, Lab, Scenario, Task, View, watch_findings

EPOCHS, BATCHES, LR, WARMUP = 3, 8, 0.1, 3
# The bug: total = BATCHES (one epoch), so the linear decay reaches 0 at step 8 and the next 16
# steps change nothing. total = EPOCHS * BATCHES = 24 ends the decay with the training.

STORY = """\
You train a small regression MLP for 3 epochs of 8 batches with the usual schedule: a short warm-up,
then a linear decay to 0 at the end of training. The run is watched:

```python
total = len(loader)                      # the number of steps the decay spans
schedule = lambda s: min(1.0, (s + 1) / 3) * max(0.0, 1 - s / total)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
with watch(model, optimizer, "run.inspect"):
    for epoch in range(3):
        for x, y in loader:
            loss = (model(x) - y).pow(2).mean()
            loss.backward(); optimizer.step(); scheduler.step(); optimizer.zero_grad()
```

Nothing fails and nothing warns in the terminal. But the model ends up far worse than the same model
trained for one epoch by a colleague would suggest, and the losses of the last two epochs look oddly
familiar. From the run file: at which step did the training stop changing the model, and why?
"""

SOLUTION = """\
`total = len(loader)` counts one epoch (8 steps), not the whole training (24). The decay
`1 - s / total` reaches 0 at step 8, so from then on every `optimizer.step()` multiplies a real
gradient by a learning rate of 0: the gradients stay as large as ever (nothing vanished), the
weights never move again, and epochs 2 and 3 print exactly the same losses batch for batch. The
watch names it: `no-update` at step 9, once every learning rate has been 0 for two steps (the
Training page shows that finding, with the learning rate per step, for any run file the watch writes;
`python -m inspector watch` prints it as it appears). The fix
is `total = epochs * len(loader)` (24): the learning rate then reaches 0 only after the last step.
"""

REASONS = ("the schedule's decay ends after one epoch: every learning rate is 0 from then on",
           "the gradients vanished: there was nothing left to learn from",
           "the optimizer lost track of the parameters after the first epoch",
           "the loss reached its minimum, so the updates became zero")
RIGHT_REASON = REASONS[0]


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(BATCHES, 16, 8, generator=g)  # (batches, B, 8)
    return x, x.sum(-1, keepdim=True).sin()  # (batches, B, 1)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))


def train(model: nn.Module, total: int, folder: str | Path) -> Any:
    """The story's loop, watched, with ``total`` as the decay's length; the run read back whole."""
    from ..watching import read_run, watch

    x, y = _data()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / WARMUP) * max(0.0, 1 - s / total))
    path = Path(folder) / "run.inspect"
    with watch(model, optimizer, path, name="stalled-schedule") as w:
        for _ in range(EPOCHS):
            for b in range(BATCHES):
                loss = (model(x[b]) - y[b]).pow(2).mean()
                loss.backward()
                w.log(loss=loss)
                optimizer.step()
                scheduler.step()
                optimizer.zero_grad()
    return read_run(path)


def build() -> Scenario:
    model = _model()
    original = copy.deepcopy(model)
    with tempfile.TemporaryDirectory(prefix="inspector-lab-") as folder:  # read whole, then removed
        run = train(model, BATCHES, folder)
    loaded = LoadedModel(model, "regression MLP (after 3 epochs)", "lab:stalled-schedule")
    return Scenario(loaded, {"original": original, "run": run})


def _lrs(run: Any) -> pd.DataFrame:
    cols = [c for c in run.steps.columns if c.startswith("lr_")]
    return run.steps[["step", *cols]]


def _first_still(run: Any) -> int | None:
    """The first step from which every learning rate stays 0 to the end (None if there is none)."""
    lrs = _lrs(run).set_index("step")
    zero = (lrs == 0).all(axis=1)
    moving = zero[~zero]
    first = int(moving.index.max()) + 1 if len(moving) else int(zero.index.min())
    return first if first <= int(zero.index.max()) else None


def check_stopped(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    run = scenario.extras["run"]
    first = _first_still(run)
    if first is None:
        return CheckResult(False, "The run file shows no step from which the model stopped changing.")
    found = [f for f in run.findings if f.code == "no-update"]
    evidence = (f"run file: every learning rate is 0 from step {first} to the last step "
                f"({int(run.steps['step'].max())})",
                *(f"watch: {f.code} at step {f.step}" for f in found))
    step = answers["step"]
    if step == first:
        return CheckResult(True, f"Right: from step {first} on, optimizer.step() changes nothing.", evidence)
    if step == first + 1 and found:
        why = "that is when the watch had seen two such steps; the first one came before"
    elif step < first:
        why = "the step after it still moved the weights (compare that batch's loss in the next epoch)"
    else:
        why = "the weights had already stopped moving before it"
    return CheckResult(False, f"Not step {step}: {why}.")


def check_why(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    """The reason against the run file, and the student's ``total`` by training the story's loop again."""
    run = scenario.extras["run"]
    steps = len(run.steps)
    total = answers["total"]
    grads = run.steps["grad_norm"]
    evidence = [f"run file: gradient norm from {grads.min():.3g} to {grads.max():.3g} at every step "
                "(nothing vanished)",
                f"run file: {steps} steps, learning rate 0 from step {_first_still(run)}"]
    wrong = []
    if answers["reason"] != RIGHT_REASON:
        wrong.append("that reason does not fit the run file: look at the gradient norm and the learning "
                     "rate per step")
    if total < 1:
        wrong.append(f"total = {total} divides by nothing sensible: give the number of steps the decay spans")
    else:
        with tempfile.TemporaryDirectory(prefix="inspector-lab-") as folder:
            again = train(copy.deepcopy(scenario.extras["original"]), total, folder)
        stalled = [f for f in again.findings if f.code == "no-update"]
        last_lr = float(_lrs(again).iloc[-1, 1:].min())
        evidence.append(f"trained again with total = {total}: "
                        + (f"no-update at step {stalled[0].step}" if stalled else "no no-update finding")
                        + f", learning rate {last_lr:.3g} at the last step")
        if stalled:
            wrong.append(f"with total = {total} the learning rate still reaches 0 before the end")
        elif total != steps:
            wrong.append(f"with total = {total} the decay does not end with the training: the story wants "
                         "the learning rate to reach 0 at the end of the last epoch")
    if wrong:
        return CheckResult(False, "Not yet: " + "; ".join(wrong) + ".", tuple(evidence))
    return CheckResult(True, f"Right: the decay must span all {steps} steps; with total = {steps} the "
                             "model keeps learning to the end.", tuple(evidence))


def _losses(scenario: Scenario) -> pd.DataFrame:
    steps = scenario.extras["run"].steps
    return pd.DataFrame({"step": steps["step"], "epoch": steps["step"] // BATCHES,
                         "batch": steps["step"] % BATCHES, "loss": steps["loss"]})


def _grads(scenario: Scenario) -> pd.DataFrame:
    return scenario.extras["run"].steps[["step", "grad_norm"]]


LAB = Lab(
    id="stalled-schedule",
    title="The stalled schedule",
    story=STORY,
    build=build,
    tasks=(
        Task(
            id="stopped",
            prompt="From which step on (counting from 0) does `optimizer.step()` change nothing?",
            fields=(Field("step", "Step", "number"),),
            check=check_stopped,
            hints=("Put the losses of two epochs side by side, batch by batch: the same batch with the same "
                   "weights gives the same loss.",
                   "The loss of a step is computed before that step's update: find the first step whose "
                   "loss comes back exactly one epoch later."),
            solution=lambda s: {"step": _first_still(s.extras["run"])},
        ),
        Task(
            id="why",
            prompt="Why did it stop, and what should `total` be so that the schedule does what the story "
                   "wants?",
            fields=(Field("reason", "Why", "choice", REASONS), Field("total", "total =", "number")),
            check=check_why,
            hints=("The gradient norm per step tells whether there was still something to learn.",
                   "The learning rate per step shows what the schedule did; the decay should end when "
                   "the training ends."),
            solution=lambda s: {"reason": RIGHT_REASON, "total": len(s.extras["run"].steps)},
        ),
    ),
    views=(
        View("Loss per step", _losses, "From the watch's run file; epoch and batch counted from 0."),
        View("Gradient norm per step", _grads, "The norm of all gradients before each optimizer step."),
        View("Learning rate per step", lambda s: _lrs(s.extras["run"]),
             "What the scheduler set before each step.", after="stopped"),
        View("Findings of the watch", watch_findings,
             "Each at the step it first appeared, as the Training page lists them.", after="stopped"),
    ),
    solution=SOLUTION,
)
