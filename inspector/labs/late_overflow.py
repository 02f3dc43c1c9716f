"""Lab: the late overflow — a gate that turns NaN only after a dozen training steps."""

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
from ..utils.labels import ROOT_LABEL
from .core import CheckResult, Field, Lab, Scenario, Task, View, watch_findings

STEPS = 20
GROWTH = 1.3  # the sharpening schedule multiplies the gate's sharpness by this every step

STORY = """\
A small regression model has a *gate*: it weighs its 16 hidden features with a softmax whose
sharpness grows during training (a schedule meant to make the gate more decisive):

```python
weights = torch.exp(self.sharpness * h)
weights = weights / weights.sum(-1, keepdim=True)
...
model.gate.sharpness *= 1.3          # every step
```

The first steps train fine. Then the loss prints `nan` and never recovers. Train it for
20 steps with the watch on (`with watch(model, optimizer, "run.inspect", nonfinite=True)`):
which module produced the first NaN/Inf, at which step, and what is the fix?
"""

SOLUTION = """\
`exp(sharpness * h)` overflows float32 once `sharpness * h` passes about 88.7: the sharpness
grows by 1.3x per step, and at step 10 the largest gate input times the sharpness crosses it. `inf /
inf` is NaN, so the gate's output is NaN although its input is finite: the watch names
`gate` (`nonfinite-forward`), not `head` or the model, which only pass the NaN on. Every
gradient is then NaN and the optimizer writes NaN into every weight (`nonfinite-parameter`
the same step). The fix is the stable softmax: `torch.softmax(sharpness * h, -1)` subtracts the
row maximum before `exp`, so no value overflows, whatever the sharpness.
"""


class Gate(nn.Module):
    """Softmax weights over the features, by hand (``stable=False``) or by ``torch.softmax``."""

    def __init__(self, stable: bool = False) -> None:
        super().__init__()
        self.sharpness: torch.Tensor
        self.register_buffer("sharpness", torch.tensor(1.0))
        self.stable = stable

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, 16) -> (B, 16)
        if self.stable:
            return h * torch.softmax(self.sharpness * h, -1)
        weights = torch.exp(self.sharpness * h)
        return h * (weights / weights.sum(-1, keepdim=True))


class GatedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.gate = Gate()
        self.head = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 8) -> (B, 1)
        return self.head(self.gate(self.inp(x)))  # inp runs first, then gate, then head


def _inputs(batch_size: int) -> torch.Tensor:
    return torch.randn(batch_size, 8, generator=torch.Generator().manual_seed(0)) * 4.0


def _loss(outputs: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    return (outputs - inputs.sum(-1, keepdim=True).sin()).pow(2).mean()


def _sharpen(model: nn.Module, step: int) -> None:
    gate = model.get_submodule("gate")
    assert isinstance(gate, Gate)
    gate.sharpness.fill_(GROWTH ** step)


def watch_training(model: nn.Module, folder: str | Path) -> Any:
    """Train ``model`` for ``STEPS`` SGD steps with the sharpening schedule, watched; the result."""
    from ..watching import train_watched

    return train_watched(model, _inputs, _loss, STEPS, Path(folder) / "run.inspect", optimizer="sgd", lr=0.01,
                         batch_size=16, nonfinite=True, before_step=_sharpen, name="gated-net")


def build() -> Scenario:
    from ..watching import read_run

    torch.manual_seed(0)
    model = GatedNet()
    original = copy.deepcopy(model)
    with tempfile.TemporaryDirectory(prefix="inspector-lab-") as folder:  # read whole, then removed
        result = watch_training(model, folder)
        run = read_run(result.path)
        _ = run.captures  # the producer's copy, read now: the folder goes away
    loaded = LoadedModel(model, "gated-net (after 20 steps)", "lab:late-overflow",
                         inputs_fn=_inputs, loss_fn=_loss)
    return Scenario(loaded, {"original": original, "result": result, "run": run})


def _first(scenario: Scenario, code: str) -> Any:
    return next((f for f in scenario.extras["result"].findings if f.code == code), None)


def module_names(scenario: Scenario) -> list[str]:
    return [ROOT_LABEL] + [n for n, _ in scenario.extras["original"].named_modules() if n]


def check_producer(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    found = _first(scenario, "nonfinite-forward")
    if found is None:
        return CheckResult(False, "The watch found no non-finite forward pass in this run.")
    evidence = (f"watch: nonfinite-forward at {found.where}, step {found.step}",)
    wrong = []
    if answers["module"] != found.where:
        order = module_names(scenario)
        picked = answers["module"]
        if picked == ROOT_LABEL:
            why = "the model as a whole only returns what one of its modules produced"
        elif picked in order and found.where in order and order.index(picked) < order.index(found.where):
            why = "it runs upstream, before the producer, and its output was still finite"
        else:
            why = "a module downstream only passes it on"
        wrong.append(f"{picked} is not where the NaN/Inf was produced ({why}; look for finite inputs and a "
                     "non-finite output)")
    if answers["step"] != found.step:
        wrong.append(f"step {answers['step']} is not the first step with a non-finite output")
    if wrong:
        return CheckResult(False, "Not yet: " + "; ".join(wrong) + ".")
    return CheckResult(
        True, f"Right: {found.where} produced the first NaN/Inf, at step {found.step}.", evidence
    )


FIXES = ("use torch.softmax", "lower the learning rate tenfold", "clip every gradient value to ±1")


def check_fix(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    """Retrain a copy of the untrained model with the chosen fix, watched, and look for NaN/Inf."""
    from ..watching import train_watched

    model = copy.deepcopy(scenario.extras["original"])
    fix = answers["fix"]
    with tempfile.TemporaryDirectory() as folder:
        if fix == "use torch.softmax":
            model.gate.stable = True
            result = watch_training(model, folder)
        else:  # the learning rate tenfold lower, or every gradient value clipped to ±1 as it is computed
            clipped = fix == FIXES[2]
            for p in model.parameters() if clipped else ():
                p.register_hook(lambda g: g.clamp(-1.0, 1.0))
            result = train_watched(
                model,
                _inputs,
                _loss,
                STEPS,
                Path(folder) / "run.inspect",
                optimizer="sgd",
                lr=0.01 if clipped else 0.001,
                batch_size=16,
                nonfinite=True,
                before_step=_sharpen,
            )
    bad = [f for f in result.findings if f.code.startswith("nonfinite")]
    evidence = (
        f"retrained {STEPS} steps with '{fix}': "
        + (", ".join(f"{f.code} at {f.where} (step {f.step})" for f in bad) if bad else "no NaN/Inf"),
    )
    if bad:
        return CheckResult(False, f"With '{fix}' the gate still produces NaN/Inf: the overflow is in the "
                                  "forward pass, before any gradient or learning rate.", evidence)
    return CheckResult(True, "Fixed: the stable softmax never overflows, whatever the sharpness.", evidence)


def _steps(scenario: Scenario) -> pd.DataFrame:
    return scenario.extras["run"].steps[["step", "loss", "grad_norm", "nonfinite"]]


def _captures(scenario: Scenario) -> pd.DataFrame:
    caps = scenario.extras["run"].captures
    columns = ["module", "kind", "shape", "min", "max", "nan", "inf"]
    return caps.stats[columns] if caps is not None else pd.DataFrame(columns=columns)


LAB = Lab(
    id="late-overflow",
    title="The late overflow",
    story=STORY,
    build=build,
    tasks=(
        Task(
            id="producer",
            prompt="Which module produced the first NaN/Inf, and at which step (counting from 0)?",
            fields=(Field("module", "Module", "choice", module_names), Field("step", "Step", "number")),
            check=check_producer,
            hints=("The loss and gradient norm per step show when it went wrong: the first step whose "
                   "loss is not finite.",
                   "Read the gate's forward in the story: which operation turns a finite input into Inf "
                   "once the sharpness is large, and what is inf / inf? The producer's input is finite, "
                   "its output is not."),
            solution=lambda s: {"module": _first(s, "nonfinite-forward").where,
                                "step": _first(s, "nonfinite-forward").step},
        ),
        Task(
            id="fix",
            prompt="Which change stops the NaN? The checker retrains the model with it, watched.",
            fields=(Field("fix", "Fix", "choice", FIXES),),
            check=check_fix,
            hints=("The NaN appears in the forward pass: nothing about gradients can prevent it.",
                   "Where does exp(x) overflow in float32, and how does a softmax avoid it?"),
            solution={"fix": "use torch.softmax"},
        ),
    ),
    views=(
        View("Loss and gradient norm per step", _steps, "From the watch's run file."),
        View("Findings of the watch", watch_findings, "Each at the step it first appeared.",
             after="producer"),
        View("Inputs and outputs of the producer", _captures,
             "Copied by the watch when the module first produced NaN/Inf (stored next to the run file).",
             after="producer"),
    ),
    solution=SOLUTION,
)
