"""Lab: the shifted offsets — a gradient vector of trainable parameters only, read with the full map."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import pandas as pd
import torch
from torch.nn.utils import parameters_to_vector

from ..loading.models import call_model, load_model
from ..utils.findings import InspectorError
from ..utils.locks import model_lock
from .core import CheckResult, Field, Lab, Scenario, Task, View

BAD_INDEX = 100
# frozen-adapter, parameters() order (numel): layers.0.base.weight 128, .base.bias 16 (frozen),
# .lora_A.weight 16, .lora_B.weight 32 (trainable), layers.1: 256, 16 (frozen), 32, 32,
# layers.2: 64, 4 (frozen), 32, 8. Trainable-only vector: layers.1.lora_B.weight is [80, 112),
# so index 100 is its element 20 = (10, 0) of shape (16, 2). In the full vector the same tensor
# starts at 128+16+16+32+256+16+32 = 496, shifted by the 416 frozen elements before it, and
# index 100 falls in layers.0.base.weight (element (12, 4) of shape (16, 8)).

STORY = f"""\
You fine-tune only the low-rank adapters of `frozen-adapter`. Your gradient check builds the
gradient vector the way the optimizer sees it:

```python
trainable = [p for p in model.parameters() if p.requires_grad]
g = parameters_to_vector([p.grad for p in trainable])
```

and reports that **element {BAD_INDEX} of `g` is NaN**. A teammate looks it up with
`inspector.locate(model, {BAD_INDEX})` and says the culprit is `layers.0.base.weight` —
which is frozen and has no gradient at all. Who is right?
"""

SOLUTION = f"""\
`locate` and `offset_map` read offsets in `parameters()` order, and `parameters()` does **not**
skip frozen parameters. The vector built from trainable parameters leaves the frozen ones out,
so every later offset moves. In the trainable-only map (`offset_map(model,
trainable_only=True)`), index {BAD_INDEX} is element (10, 0) of `layers.1.lora_B.weight`
(its segment is [80, 112)). In the full map that tensor starts at 496: shifted by the 416
frozen elements (layers.0.base and layers.1.base) in front of it. Look up an index in the map
that matches how the vector was built.
"""


def build() -> Scenario:
    loaded = load_model("sample:frozen-adapter")
    model = loaded.model
    inputs = loaded.example_inputs(4)
    with model_lock(model):
        out = call_model(model, inputs)
        loaded.loss(out, inputs).backward()
    trainable = [p for p in model.parameters() if p.requires_grad]
    with torch.no_grad():
        missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        if missing:
            raise InspectorError(f"parameter {missing[0]} got no gradient from the loss; the lab needs every "
                                 "trainable parameter to get one")
        grads = [p.grad for p in trainable if p.grad is not None]
        flat = parameters_to_vector(grads)
        flat[BAD_INDEX] = float("nan")
        torch.nn.utils.vector_to_parameters(flat, grads)
    loaded.name = "frozen-adapter (adapters trained, NaN in the gradient)"
    return Scenario(loaded, {"bad_index": BAD_INDEX})


def _maps(scenario: Scenario) -> tuple[pd.DataFrame, pd.DataFrame]:
    from ..offsets import offset_map

    return offset_map(scenario.model), offset_map(scenario.model, trainable_only=True)


def _row_at(table: pd.DataFrame, index: int) -> pd.Series:
    hit = table[(table["start"] <= index) & (table["end"] > index)]
    if hit.empty:
        raise InspectorError(f"flat index {index} is outside the vector (length {int(table['end'].max())})")
    return hit.iloc[0]


def parse_element(text: Any) -> tuple[int, ...]:
    """``"(10, 0)"``, ``"10,0"`` or ``"[10][0]"`` as ``(10, 0)``.

    >>> parse_element("(10, 0)")
    (10, 0)
    """
    nums = re.findall(r"-?\d+", str(text))
    if not nums:
        raise InspectorError(f"element: write the index as numbers, e.g. (3, 1); got {text!r}")
    return tuple(int(n) for n in nums)


def names(scenario: Scenario) -> list[str]:
    return [n for n, _ in scenario.model.named_parameters()]


def check_locate(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    from ..offsets import locate

    index = scenario.extras["bad_index"]
    loc = locate(scenario.model, index, trainable_only=True)
    naive = locate(scenario.model, index)
    evidence = (f"locate(model, {index}, trainable_only=True): {loc.describe()}",
                f"locate(model, {index}): {naive.name}{list(naive.element)}, the full map's answer")
    got = parse_element(answers["element"])
    if answers["parameter"] != loc.name:
        hint = (" That is what the full map says, but the vector was built from trainable parameters."
                if answers["parameter"] == naive.name else "")
        return CheckResult(False, f"{answers['parameter']} is not where index {index} of the "
                                  f"trainable-only vector falls.{hint}")
    if got != loc.element:
        return CheckResult(False, f"Right parameter, but element {got} is not the one: subtract the "
                                  "segment's start, then unravel in the tensor's shape.")
    return CheckResult(True, f"Right: {loc.name}{list(loc.element)} (segment [{loc.start}, "
                             f"{loc.end}) of the trainable-only vector).", evidence)


REASONS = (
    "frozen parameters come before it in parameters(), so the full map counts them",
    "buffers are counted in the full map",
    "a tied weight is counted twice in the full map",
    "parameters_to_vector sorts tensors by size",
)


def check_shift(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    from ..aliases import alias_groups
    from ..offsets import offset_map

    full, trainable = _maps(scenario)
    index = scenario.extras["bad_index"]
    name = _row_at(trainable, index)["name"]
    start_full = int(full.loc[full["name"] == name, "start"].iloc[0])
    shift = start_full - int(trainable.loc[trainable["name"] == name, "start"].iloc[0])
    frozen_before = int(full.loc[(~full["requires_grad"].astype(bool)) & (full["start"] < start_full),
                                 "numel"].sum())
    with_buffers = offset_map(scenario.model, include_buffers=True)
    buffers_move = bool((with_buffers.loc[with_buffers["name"] == name, "start"] != start_full).any())
    # What the analyses say about each explanation:
    truth = {REASONS[0]: frozen_before == shift and shift > 0,
             REASONS[1]: buffers_move,
             REASONS[2]: bool(alias_groups(scenario.model, include_buffers=False)),
             REASONS[3]: False}
    evidence = (f"{name} starts at {start_full} in the full map and at {start_full - shift} in the "
                f"trainable-only map: shift {shift}",
                f"frozen elements before it in parameters(): {frozen_before}",
                f"buffers move it: {buffers_move}; alias groups: {truth[REASONS[2]]}")
    if answers["shift"] != shift:
        return CheckResult(False, f"{answers['shift']} is not the shift of {name}: compare its start "
                                  "in the two maps.")
    if not truth.get(answers["reason"], False):
        return CheckResult(False, "The shift is right, but that explanation does not fit what the "
                                  "maps show.")
    return CheckResult(True, f"Right: {name} moves by {shift}, exactly the frozen elements in front "
                             "of it.", evidence)


def _side_by_side(scenario: Scenario) -> pd.DataFrame:
    full, trainable = _maps(scenario)
    t = trainable.set_index("name")[["start", "end"]].rename(columns=lambda c: f"trainable {c}")
    out = full[["name", "numel", "requires_grad", "start", "end"]].rename(
        columns={"start": "full start", "end": "full end"}).set_index("name").join(t)
    return out.astype({"trainable start": "Int64", "trainable end": "Int64"}).reset_index()  # frozen: empty


def _strip(scenario: Scenario) -> Any:
    from ..figures.offsets import offset_strip

    full, trainable = _maps(scenario)
    return offset_strip(full, trainable)


def _strip_with_norms(scenario: Scenario) -> Any:
    from ..figures.offsets import offset_strip
    from ..offsets import gradient_norms

    full, trainable = _maps(scenario)
    return offset_strip(full, trainable, gradient_norms(scenario.model))


def _norms(scenario: Scenario) -> pd.DataFrame:
    from ..offsets import gradient_norms

    return gradient_norms(scenario.model)


LAB = Lab(
    id="shifted-offsets",
    title="The shifted offsets",
    story=STORY,
    build=build,
    tasks=(
        Task(
            id="locate",
            prompt=f"Which parameter and which element does index {BAD_INDEX} of the trainable-only "
                   "gradient vector belong to?",
            fields=(Field("parameter", "Parameter", "choice", names),
                    Field("element", "Element index", placeholder="(row, column)")),
            check=check_locate,
            hints=("Use the map that matches how the vector was built: trainable parameters only.",
                   "Find the segment with start <= 100 < end, then unravel 100 - start in its shape.",
                   "Unravel row by row: in a tensor of shape (16, 2), element k is (k // 2, k % 2)."),
            solution={"parameter": "layers.1.lora_B.weight", "element": "(10, 0)"},
        ),
        Task(
            id="shift",
            prompt="By how many elements is that parameter's offset shifted in the full map, and why "
                   "do the two maps disagree?",
            fields=(Field("shift", "Shift (elements)", "number"),
                    Field("reason", "Why", "choice", REASONS)),
            check=check_shift,
            hints=("Put the two maps side by side and compare the start of the same parameter.",
                   "Add up the numel of the rows with requires_grad False above it."),
            solution={"shift": 416, "reason": REASONS[0]},
        ),
    ),
    views=(
        View("Offsets: full map vs trainable-only map", _side_by_side,
             "Rows in parameters() order; frozen rows have no trainable offsets."),
        View("Offset strip: full vector above, trainable-only vector below", _strip,
             "Hover a segment for its name and range; frozen and trainable segments differ in colour."),
        View("Offset strip coloured by gradient norm", _strip_with_norms,
             "The colour is the segment's gradient norm; a non-finite one stands out.", after="locate"),
        View("Gradient norms per parameter", _norms, after="locate"),
    ),
    solution=SOLUTION,
)
