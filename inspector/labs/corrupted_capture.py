"""Lab: the corrupted capture — a hook keeps outputs by reference, an in-place ReLU overwrites them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd
import torch

from ..loading.models import call_model, load_model
from ..utils.locks import model_lock
from .core import CheckResult, Field, Lab, Scenario, Task, View

# cnn-bn runs relu1 = ReLU(inplace=True) on conv1's output and relu2 on bn2's output: a hook
# that keeps conv1's and bn2's outputs by reference ends up holding the ReLU'd values.
CORRUPTED = {"conv1": "relu1", "bn2": "relu2"}

STORY = """\
You study the features of `cnn-bn` with the hook everybody copies:

```python
features = {}
for name, module in model.named_modules():
    module.register_forward_hook(lambda m, i, out, name=name: features.setdefault(name, out))
model(images)
```

The histograms look odd: the convolution outputs have **no negative values at all**, and the
BatchNorm output is not centred. The model itself computes the right logits. Which captures
can you not trust, and what wrote into them?
"""

SOLUTION = """\
The hook keeps a *reference* to each output. `relu1` and `relu2` are `ReLU(inplace=True)`:
they write their result into the tensor they receive — the very tensor the hook kept for
`conv1` and for `bn2`. So `features["conv1"]` and `features["bn2"]` show post-ReLU values,
while `relu1`'s and `relu2`'s own captures are right. `capture_activations` stores
`output.detach().clone()` at hook time and names the mutated modules and what changed them,
using the tensor version counter (or, in inference mode, a comparison).
"""


def build() -> Scenario:
    loaded = load_model("sample:cnn-bn")
    model = loaded.model.eval()
    images = loaded.example_inputs(2)
    naive: dict[str, Any] = {}
    handles = []
    with model_lock(model):
        try:
            for name, module in model.named_modules():
                if name:
                    handles.append(module.register_forward_hook(
                        lambda m, i, out, name=name: naive.setdefault(name, out)))
            with torch.no_grad():
                call_model(model, images)
        finally:
            for h in handles:
                h.remove()
    return Scenario(loaded, {"inputs": images, "naive": naive})


def module_names(scenario: Scenario) -> list[str]:
    return [n for n, _ in scenario.model.named_modules() if n]


def _captures(scenario: Scenario):
    from ..capture import capture_activations

    with torch.no_grad():
        return capture_activations(scenario.model, scenario.extras["inputs"])


def mutated_by(scenario: Scenario) -> dict[str, str | None]:
    """``{captured module: module that overwrote its output (None if unknown)}`` from the capture."""
    caps = _captures(scenario)
    mutated = caps.mutated
    if isinstance(mutated, Mapping):
        return {str(k): (None if v is None else _module_name(v)) for k, v in mutated.items()}
    return {str(k): None for k in mutated}


def _module_name(value: Any) -> str:
    for attr in ("by", "module", "name"):
        if isinstance(getattr(value, attr, None), str):
            return getattr(value, attr)
    return str(value)


def check_corrupted(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    truth = set(mutated_by(scenario))
    named = set(answers["modules"])
    if named != truth:
        bits = []
        if named - truth:
            bits.append(f"{', '.join(sorted(named - truth))}: the capture of that output is intact")
        if truth - named:
            bits.append(f"{len(truth - named)} corrupted capture(s) not named")
        return CheckResult(False, "Not yet: " + "; ".join(bits) + ".")
    return CheckResult(True, f"Right: the captures of {', '.join(sorted(truth))} were changed after "
                             "the hook kept them.",
                       (f"capture_activations(...).mutated: {', '.join(sorted(truth))}",))


def check_culprits(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    truth = mutated_by(scenario)
    pairs = answers["pairs"]
    unknown = [k for k in truth if truth[k] is None]
    if unknown:
        return CheckResult(False, "The capture analysis cannot tell what overwrote "
                                  f"{', '.join(unknown)}, so this task cannot be graded here.")
    if set(pairs) != set(truth):
        return CheckResult(False, "Give one line per corrupted capture (and only those): "
                                  "`captured -> overwriter`.")
    wrong = [k for k, v in pairs.items() if truth[k] != v]
    if wrong:
        return CheckResult(False, f"Not what overwrote {', '.join(sorted(wrong))}: which module ran "
                                  "next on the same tensor, in place?")
    return CheckResult(True, "Right: " + "; ".join(f"{v} wrote into {k}'s output" for k, v in
                                                   sorted(truth.items())) + ".",
                       tuple(f"capture_activations: {k} mutated by {v}" for k, v in sorted(truth.items())))


def _compare(scenario: Scenario) -> pd.DataFrame:
    caps = _captures(scenario)
    rows = []
    for name, ref in scenario.extras["naive"].items():
        clone = caps.outputs.get(name)
        if not isinstance(ref, torch.Tensor) or not isinstance(clone, torch.Tensor):
            continue
        ref_cpu = ref.detach().to("cpu", torch.float32)
        clone_cpu = clone.detach().to("cpu", torch.float32)
        rows.append(
            {
                "module": name,
                "naive min": float(ref_cpu.min()),
                "clone min": float(clone_cpu.min()),
                "naive negatives": int((ref_cpu < 0).sum()),
                "clone negatives": int((clone_cpu < 0).sum()),
            }
        )
    return pd.DataFrame(rows)


def _histograms(scenario: Scenario) -> list[Any]:
    from ..figures.capture import capture_histogram

    return [capture_histogram(ref, title=f"{name}: what the naive hook kept")
            for name, ref in scenario.extras["naive"].items()
            if isinstance(ref, torch.Tensor) and ref.dim() == 4]


def _stats(scenario: Scenario) -> pd.DataFrame:
    return _captures(scenario).stats


LAB = Lab(
    id="corrupted-capture",
    title="The corrupted capture",
    story=STORY,
    build=build,
    tasks=(
        Task(
            id="corrupted",
            prompt="Which modules' captures did the naive hook get wrong?",
            fields=(Field("modules", "Corrupted captures", "multi", module_names),),
            check=check_corrupted,
            hints=("Compare what the naive hook kept with the clones the inspector captured.",
                   "A capture is wrong when something later wrote into the same memory: a convolution or "
                   "BatchNorm output without a single negative value is suspect."),
            solution={"modules": sorted(CORRUPTED)},
        ),
        Task(
            id="culprits",
            prompt="For each corrupted capture, which module overwrote it? One line each: "
                   "`captured -> overwriter`.",
            fields=(Field("pairs", "captured -> overwriter", "pairs", placeholder="conv2 -> pool"),),
            check=check_culprits,
            hints=("Look at the modules that run in place.",
                   "`nn.ReLU(inplace=True)` writes its result into its input tensor."),
            solution={"pairs": "\n".join(f"{k} -> {v}" for k, v in CORRUPTED.items())},
        ),
    ),
    views=(
        View("Naive hook vs detached clones", _compare,
             "A capture you can trust has the same values as its clone."),
        View("Capture statistics (clones)", _stats, "The mutated column is the inspector's own verdict.",
             after="corrupted"),
        View("Histograms of the naive captures", _histograms,
             "Convolution and BatchNorm outputs are usually centred near zero.", on_demand=True),
    ),
    solution=SOLUTION,
)
