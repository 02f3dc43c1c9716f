"""Lab: find the op — a NaN made by one op inside a named block, found by replaying the step."""

from __future__ import annotations

import copy
import inspect
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..loading.models import LoadedModel
from ..replaying import Replay, replay
from .core import CheckResult, Field, Lab, Scenario, Task, View

STEPS = 8
PADDED = 5  # the step whose batch holds a padding row of zeros

STORY = """\
A small classifier standardises its inputs with a hand-written block, `norm`, before two linear
layers. It trains for a few steps, then the loss turns `nan`. The watch (`keep=True`) names the step
and the block, and kept the step so that it can be run again:

```python
with watch(model, optimizer, "run.inspect", keep=True) as w:
    ...
r = inspector.replay("run.inspect", step, model=model, loss=loss)
```

The replay ran the step again with every op checked. Which aten op made the first NaN, and on which
line of `norm`'s forward?
"""

SOLUTION = """\
One sample of the padded batch is all zeros. `norm` centres each row (`x - mean`: zeros), takes the
spread (`mean of squares`: 0) and divides by its square root: `0 / sqrt(0)` is `0 / 0`, NaN. Every op
before the division had finite inputs and finite outputs (a zero is finite); `aten.div.Tensor` is the
first op whose inputs are finite and whose output is not. The fix is an epsilon under the square root
(`(spread + 1e-5).sqrt()`), as `nn.LayerNorm` does.
"""


class Standardise(nn.Module):
    """Each row to zero mean and unit spread, by hand (no epsilon)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 8) -> (B, 8)
        centred = x - x.mean(-1, keepdim=True)
        spread = centred.pow(2).mean(-1, keepdim=True)
        return centred / spread.sqrt()


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc1, self.fc2 = Standardise(), nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 8) -> (B, 3)
        return self.fc2(torch.relu(self.fc1(self.norm(x))))


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)
    if step == PADDED:
        x[3] = 0.0  # a padding row
    return x, y


def _targets(x: torch.Tensor) -> torch.Tensor:
    """The labels of the batch ``x`` is (the loss the replay runs looks them up)."""
    return next(y for s in range(STEPS) for bx, y in [_batch(s)] if torch.equal(bx, x))


def loss(outputs: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(outputs, _targets(inputs))


def build() -> Scenario:
    from ..watching import read_run, watch

    torch.manual_seed(0)
    model = Classifier()
    original = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with tempfile.TemporaryDirectory(prefix="inspector-lab-") as folder:  # read whole, then removed
        path = Path(folder) / "run.inspect"
        with watch(model, opt, path, keep=True, name="classifier") as w:
            for step in range(STEPS):
                x, _ = _batch(step)
                out = loss(model(x), x)
                out.backward()
                w.log(loss=out)
                opt.step()
                opt.zero_grad()
        run = read_run(path)
        step = min(f.step for f in run.findings if f.severity == "error")
        replayed = replay(path, step, model=model, loss=loss)
    loaded = LoadedModel(model, "classifier (after 8 steps)", "lab:find-the-op",
                         inputs_fn=lambda b: _batch(0)[0][:b], loss_fn=loss)
    return Scenario(loaded, {"original": original, "run": run, "replay": replayed, "step": step})


OPS = ("aten.mean.dim", "aten.sub.Tensor", "aten.pow.Tensor_Scalar", "aten.sqrt.default", "aten.div.Tensor")


def _lines() -> list[str]:
    """The lines of ``Standardise.forward``'s body, as the student reads them."""
    source, start = inspect.getsourcelines(Standardise.forward)
    return [f"line {start + i}: {text.strip()}" for i, text in enumerate(source) if i and text.strip()]


def _culprit(scenario: Scenario) -> Any:
    r: Replay = scenario.extras["replay"]
    return r.first_in("forward")


def check_op(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    first = _culprit(scenario)
    if first is None:
        return CheckResult(False, "The replay found no op that made NaN/Inf in this run.")
    evidence = (f"replay of step {scenario.extras['step']}: {first.line()}",)
    line = next((ln for ln in _lines() if ln.startswith(f"line {first.source.rpartition(':')[2]}:")), "")
    wrong = []
    if answers["op"] != first.op:
        wrong.append(f"{answers['op']} is not it: its output was finite, or it only passed a NaN on")
    if answers["line"] != line:
        wrong.append("that line is not where the first NaN was made")
    if wrong:
        return CheckResult(False, "Not yet: " + "; ".join(wrong) + ".")
    return CheckResult(True, f"Right: {first.op} in {first.module} made the first NaN ({line}).", evidence)


def _findings(scenario: Scenario) -> pd.DataFrame:
    rows = [{"step": f.step, "code": f.code, "where": f.where, "message": f.message}
            for f in scenario.extras["run"].findings]
    return pd.DataFrame(rows, columns=["step", "code", "where", "message"])


def _ops(scenario: Scenario) -> pd.DataFrame:
    r: Replay = scenario.extras["replay"]
    rows = [{"phase": o.phase, "op": o.op, "module": o.module, "line": o.source.rpartition(":")[2],
             "inputs": "; ".join(i.text() for i in o.inputs), "nan": o.nan, "inf": o.inf} for o in r.ops]
    return pd.DataFrame(rows, columns=["phase", "op", "module", "line", "inputs", "nan", "inf"])


def _outputs(scenario: Scenario) -> pd.DataFrame:
    stats = scenario.extras["replay"].captures.stats
    columns = ["module", "kind", "shape", "min", "max", "nan", "inf"]
    return stats[[c for c in columns if c in stats]]


LAB = Lab(
    id="find-the-op",
    title="Find the op",
    story=STORY,
    build=build,
    tasks=(
        Task(
            id="op",
            prompt="Which aten op made the first NaN, and on which line of norm's forward?",
            fields=(Field("op", "Op", "choice", OPS), Field("line", "Line", "choice", lambda s: _lines())),
            check=check_op,
            hints=("The watch's findings name the step and the block; the replay's outputs show which "
                   "module's output holds NaN first, and the range of what it was given.",
                   "Follow norm's forward line by line with a row of zeros: which op is the first to take "
                   "finite inputs and give NaN?"),
            solution=lambda s: {"op": _culprit(s).op, "line": next(
                ln for ln in _lines() if ln.startswith(f"line {_culprit(s).source.rpartition(':')[2]}:"))},
        ),
    ),
    views=(
        View("Findings of the watch", _findings, "Each at the step it first appeared."),
        View("Module outputs at the replayed step", _outputs,
             "Every module's output, copied during the replay."),
        View("Ops that made NaN/Inf from finite inputs", _ops, "The replay's op table, first on top.",
             after="op"),
    ),
    solution=SOLUTION,
)
