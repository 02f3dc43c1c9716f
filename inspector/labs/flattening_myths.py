"""Lab: myths of flattening — test two common beliefs about parameters_to_vector and parameters()."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pandas as pd
import torch
from torch.nn.utils import parameters_to_vector

from ..loading.models import load_model
from .core import CheckResult, Field, Lab, Scenario, Task, View

# frozen-adapter: 12 parameter tensors, 636 elements; 6 of them trainable (the LoRA A/B
# matrices: 16+32+32+32+32+8 = 152 elements); the 6 frozen base weights and biases hold
# 128+16+256+16+64+4 = 484.
VERDICTS = ("true", "false")
CLAIM_1 = "`parameters_to_vector(model.parameters())` shares memory with the model"
CLAIM_2 = "`model.parameters()` skips frozen parameters (`requires_grad=False`)"

STORY = f"""\
Two beliefs go around your lab group, and both end up in code:

1. {CLAIM_1} — "so I can write an update into the vector and the model sees it".
2. {CLAIM_2} — "so `parameters_to_vector(model.parameters())` is the vector the optimizer
   steps".

Don't argue: run the experiments below on `frozen-adapter` (a frozen MLP with small trainable
adapters) and grade each claim by what they show.
"""

SOLUTION = """\
Both claims are false. `parameters_to_vector` concatenates *copies*: no byte of the vector
lies in a parameter's storage, and writing into it leaves the model unchanged — use
`vector_to_parameters` to write back. `parameters()` yields every registered Parameter
(deduplicated by identity) whatever its `requires_grad`: on `frozen-adapter` that is 12
tensors and 636 elements, of which only 152 are trainable. The optimizer's vector is
`[p for p in model.parameters() if p.requires_grad]`, with different offsets (see the
shifted-offsets lab).
"""


def build() -> Scenario:
    loaded = load_model("sample:frozen-adapter")
    return Scenario(loaded, {})


def memory_experiment(scenario: Scenario) -> pd.DataFrame:
    """Flatten a copy of the model, then write into the vector: do the parameters change?"""
    model = copy.deepcopy(scenario.model)
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    vec = parameters_to_vector(params)
    lo, hi = vec.data_ptr(), vec.data_ptr() + vec.numel() * vec.element_size()
    with torch.no_grad():
        vec.add_(1.0)
    rows = []
    for (name, p), old in zip(model.named_parameters(), before, strict=True):
        start = p.untyped_storage().data_ptr()
        end = start + p.untyped_storage().nbytes()
        rows.append({"parameter": name,
                     "storage overlaps the vector": bool(start < hi and lo < end),
                     "changed after vec += 1": bool(not torch.equal(p.detach(), old))})
    return pd.DataFrame(rows)


def count_experiment(scenario: Scenario) -> pd.DataFrame:
    """What parameters() yields, one row per tensor, and whether the optimizer's filter keeps it."""
    from ..offsets import offset_map

    full = offset_map(scenario.model)
    return pd.DataFrame({"parameters() yields": full["name"], "numel": full["numel"],
                         "requires_grad": full["requires_grad"].astype(bool),
                         "kept by `if p.requires_grad`": full["requires_grad"].astype(bool)})


def check_memory(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    table = memory_experiment(scenario)
    shares = bool(table["storage overlaps the vector"].any() or table["changed after vec += 1"].any())
    truth = "true" if shares else "false"
    changed = int(table["changed after vec += 1"].sum())
    evidence = (
        f"storage overlaps: {int(table['storage overlaps the vector'].sum())} of {len(table)} "
        f"parameters; changed after writing the vector: {changed}",
    )
    wrong = []
    if answers["verdict"] != truth:
        wrong.append("the verdict does not match what the experiment shows")
    if answers["changed"] != changed:
        wrong.append(f"{answers['changed']} is not how many parameters changed when the vector was written")
    if wrong:
        return CheckResult(False, "Not yet: " + "; ".join(wrong) + ". Run experiment 1 and look at both "
                                  "columns.")
    return CheckResult(True, "Right: the vector is a copy; writing into it leaves the model as it was.",
                       evidence)


def check_frozen(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    table = count_experiment(scenario)
    frozen = int((~table["requires_grad"]).sum())
    elements = int(table["numel"].sum())
    kept = table[table["requires_grad"]]
    truth = "true" if frozen == 0 else "false"
    evidence = (f"offset_map: parameters() yields {len(table)} tensors ({frozen} frozen), {elements} "
                f"elements; trainable only: {len(kept)} tensors, {int(kept['numel'].sum())} elements",)
    wrong = []
    if answers["verdict"] != truth:
        wrong.append("the verdict does not match the experiment")
    if answers["elements"] != elements:
        wrong.append(f"{answers['elements']} is not the length of parameters_to_vector(model.parameters())")
    if wrong:
        return CheckResult(False, "Not yet: " + "; ".join(wrong) + ".")
    return CheckResult(True, "Right: parameters() yields frozen parameters too; filter on requires_grad "
                             "to get what the optimizer steps.", evidence)


LAB = Lab(
    id="flattening-myths",
    title="Myths of flattening",
    story=STORY,
    build=build,
    tasks=(
        Task(
            id="shares-memory",
            prompt=f"Claim 1: {CLAIM_1}. True or false — and how many parameters did writing into the "
                   "vector change?",
            fields=(Field("verdict", "Claim 1 is", "choice", VERDICTS),
                    Field("changed", "Parameters changed by writing into the vector", "number")),
            check=check_memory,
            hints=("Run experiment 1: does any parameter's storage overlap the vector? Did writing "
                   "into the vector change a parameter?",),
            solution={"verdict": "false", "changed": 0},
        ),
        Task(
            id="skips-frozen",
            prompt=f"Claim 2: {CLAIM_2}. True or false — and how many elements does "
                   "`parameters_to_vector(model.parameters())` have?",
            fields=(Field("verdict", "Claim 2 is", "choice", VERDICTS),
                    Field("elements", "Length of parameters_to_vector(model.parameters())", "number")),
            check=check_frozen,
            hints=("Run experiment 2: does parameters() yield tensors with requires_grad False?",
                   "parameters() filters on identity (ties), never on requires_grad."),
            solution={"verdict": "false", "elements": 636},
        ),
    ),
    views=(
        View("Experiment 1: write into the flat vector", memory_experiment,
             "On a copy of the model: flatten, add 1 to every element of the vector, then "
             "look at the parameters.", on_demand=True),
        View("Experiment 2: what parameters() yields", count_experiment,
             "Listed with the inspector's offset map: one row per tensor parameters() yields.",
             on_demand=True),
    ),
    solution=SOLUTION,
)
