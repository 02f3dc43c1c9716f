"""Lab: the silent block — a fine-tune with layer-wise learning rates that never moved one block."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pandas as pd
import torch

from ..loading.models import LoadedModel, load_model
from .core import CheckResult, Field, Lab, Scenario, Task, View

STEPS, LR, DECAY = 20, 0.05, 0.8
# fsdp-mlp's blocks.0: ln 32 + 32, fc1 128x32 + 128, fc2 32x128 + 32 = 8416 elements
BLOCK_ELEMENTS = 8416
REASONS = ("frozen: its parameters have requires_grad=False",
           "no gradient reaches it: it is cut off from the loss",
           "it has gradients, but the optimizer does not hold its parameters",
           "the fine-tuned weights of that block were never saved")
RIGHT_REASON = REASONS[2]

STORY = """\
Your team fine-tunes `fsdp-mlp` with **layer-wise learning rates**: the head learns fastest, each
block below it a little slower. The optimizer is built like this:

```python
groups = [{"params": model.head.parameters(), "lr": lr},
          {"params": model.norm.parameters(), "lr": lr}]
for i in range(1, len(model.blocks)):          # deeper blocks learn slower
    groups.append({"params": model.blocks[-i].parameters(), "lr": lr * 0.8 ** i})
groups.append({"params": model.stem.parameters(), "lr": lr * 0.8 ** len(model.blocks)})
optimizer = torch.optim.SGD(groups)
```

The loss goes down, nothing warns. But the fine-tuned model behaves almost like the base one
in places. Compare the fine-tuned weights with the base weights (below, or
`inspector.compare(base, tuned)` in your own code): what did the fine-tune never touch, and why?
"""

SOLUTION = """\
`compare(base, tuned)` finds every tensor of `blocks.0` bitwise identical (`unchanged-tensor`
for the whole block, 8416 elements), while everything else moved. The block is not frozen
(`requires_grad` is True) and it has gradients (`gradient_norms` shows a finite, non-zero norm for
it after the last step): the optimizer simply never held its parameters.
`range(1, len(model.blocks))` runs over `i = 1` only, and `model.blocks[-1]` is `blocks.1`; the
first block (`blocks[-2]`, i.e. `blocks.0`) is in no parameter group. Loop over
`range(1, len(model.blocks) + 1)`, and check that the groups cover `model.parameters()`:
`{id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in model.parameters()}`.
"""


def build() -> Scenario:
    from ..comparison import compare

    loaded = load_model("sample:fsdp-mlp")
    base = copy.deepcopy(loaded.model)
    model: Any = loaded.model  # fsdp-mlp: stem, blocks, norm, head
    groups = [{"params": list(model.head.parameters()), "lr": LR},
              {"params": list(model.norm.parameters()), "lr": LR}]
    for i in range(1, len(model.blocks)):  # the bug: blocks[-len(blocks)] = blocks.0 is never added
        groups.append({"params": list(model.blocks[-i].parameters()), "lr": LR * DECAY ** i})
    groups.append({"params": list(model.stem.parameters()), "lr": LR * DECAY ** len(model.blocks)})
    optimizer = torch.optim.SGD(groups)
    torch.manual_seed(0)
    for _ in range(STEPS):
        optimizer.zero_grad()
        inputs = loaded.example_inputs(8)
        loaded.loss(model(inputs), inputs).backward()
        optimizer.step()
    names = {id(p): n for n, p in model.named_parameters()}
    held = [(i, g["lr"], names[id(p)]) for i, g in enumerate(optimizer.param_groups) for p in g["params"]]
    tuned = LoadedModel(model, "fsdp-mlp (fine-tuned)", "sample:fsdp-mlp", inputs_fn=loaded.inputs_fn,
                        loss_fn=loaded.loss_fn)
    return Scenario(tuned, {"base": base, "comparison": compare(base, model), "held": held})


def module_names(scenario: Scenario) -> list[str]:
    model: Any = scenario.model
    return [n for n, _ in model.named_children()] + [f"blocks.{i}" for i in range(len(model.blocks))]


def _unchanged(scenario: Scenario) -> dict[str, str]:
    return {
        f.where: f.message for f in scenario.extras["comparison"].findings if f.code == "unchanged-tensor"
    }


def check_which(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    unchanged = _unchanged(scenario)
    modules = scenario.extras["comparison"].modules.set_index("module")
    evidence = tuple(f"compare: unchanged-tensor at {w}: {m}" for w, m in unchanged.items())
    picked = answers["module"]
    if set(unchanged) != {picked}:
        return CheckResult(False, f"Not {picked}: compare the two models and look for the module whose "
                                  "tensors are all bitwise identical.", evidence)
    elements = int(modules.loc[picked, "numel"])
    if answers["elements"] != elements:
        return CheckResult(False, f"{picked} is right, but {answers['elements']} is not how many of its "
                                  "elements never changed.", evidence)
    return CheckResult(True, f"Right: all {elements} elements of {picked} are bitwise what they were before "
                             "the fine-tune.", evidence)


def check_why(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    from ..offsets import gradient_norms

    block = next(iter(_unchanged(scenario)), "blocks.0")
    params = [p for n, p in scenario.model.named_parameters() if n.startswith(block + ".")]
    norms = gradient_norms(scenario.model, by="module").set_index("name")
    held = {n for _, _, n in scenario.extras["held"]}
    evidence = (f"requires_grad of {block}'s parameters: {sorted({p.requires_grad for p in params})}",
                f"gradient_norms after the last step: {block} {norms.loc[block, 'state']}, "
                f"norm {norms.loc[block, 'norm']:.4g}",
                f"parameters of {block} in the optimizer's groups: "
                f"{sum(n.startswith(block + '.') for n in held)} of {len(params)}")
    if answers["reason"] != RIGHT_REASON:
        return CheckResult(
            False,
            "The evidence says otherwise: look at requires_grad, at the block's gradient "
            "norm, and at which parameters the optimizer's groups hold.",
            evidence,
        )
    return CheckResult(True, "Right: the block is trainable and has gradients, but no parameter group holds "
                             "its parameters, so optimizer.step() never touches them.", evidence)


def _findings(scenario: Scenario) -> pd.DataFrame:
    rows = [f.to_dict() for f in scenario.extras["comparison"].findings]
    return pd.DataFrame(rows, columns=["code", "severity", "where", "message"])


def _figure(scenario: Scenario) -> Any:
    from ..figures.compare import module_change_bars

    return module_change_bars(scenario.extras["comparison"].modules)


def _tensor_changes(scenario: Scenario) -> pd.DataFrame:
    """Per tensor: its size and how far the fine-tune moved it (no verdict, no module totals)."""
    tuned = dict(scenario.model.named_parameters())
    rows = []
    for name, before in scenario.extras["base"].named_parameters():
        after = tuned[name].detach()
        rows.append({"tensor": name, "shape": str(tuple(after.shape)), "numel": after.numel(),
                     "max |tuned - base|": float((after - before.detach()).abs().max())})
    return pd.DataFrame(rows)


def _groups(scenario: Scenario) -> pd.DataFrame:
    return pd.DataFrame(scenario.extras["held"], columns=["group", "lr", "parameter"])


def _gradients(scenario: Scenario) -> pd.DataFrame:
    from ..offsets import gradient_norms

    return gradient_norms(scenario.model, by="module")


LAB = Lab(
    id="silent-block",
    title="The silent block",
    story=STORY,
    build=build,
    tasks=(
        Task(
            id="which",
            prompt="Which module did the fine-tune never change, and how many elements does it hold?",
            fields=(
                Field("module", "Module", "choice", module_names),
                Field("elements", "Elements that never changed", "number"),
            ),
            check=check_which,
            hints=(
                "In the change per tensor, look for tensors the fine-tune moved by exactly 0.",
                "They all belong to one module: name it by the part of their names they share.",
                "Add up the module's LayerNorm and two Linear layers: weights and biases.",
            ),
            solution={"module": "blocks.0", "elements": BLOCK_ELEMENTS},
        ),
        Task(
            id="why",
            prompt="Why did it never change?",
            fields=(Field("reason", "Reason", "choice", REASONS),),
            check=check_why,
            hints=(
                "Is it frozen? Look at requires_grad.",
                "Does it get a gradient? Look at the gradient norms.",
                "Which parameters do the optimizer's groups hold?",
            ),
            solution={"reason": RIGHT_REASON},
        ),
    ),
    views=(
        View("Change per tensor, base -> fine-tuned", _tensor_changes,
             "Every parameter tensor in model order: the largest change of any of its elements."),
        View(
            "Change per module, base -> fine-tuned",
            _figure,
            "‖B−A‖/‖A‖ per module in model order; red: every tensor bitwise equal.",
            after="which",
        ),
        View("Compare findings", _findings, "compare(base, tuned).", after="which"),
        View(
            "Gradient norms after the last step",
            _gradients,
            "gradient_norms(model, by='module').",
            on_demand=True,
            after="which",
        ),
        View(
            "The optimizer's parameter groups", _groups, "Which parameters each group holds.", on_demand=True,
            after="which",
        ),
    ),
    solution=SOLUTION,
)
