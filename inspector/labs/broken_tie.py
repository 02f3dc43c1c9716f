"""Lab: the broken tie — a checkpoint conversion splits tiny-gpt2's tied embedding."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..loading.models import load_model
from ..utils.findings import InspectorError
from .core import CheckResult, Field, Lab, Scenario, Task, View

STORY = """\
Your team converts checkpoints to float64 for a numerical study. The conversion script is
two lines:

```python
state = {k: v.to(torch.float64) for k, v in model.state_dict().items()}
model.load_state_dict(state, assign=True)   # assign: keep the float64 tensors, no copy
```

Nothing fails. The loss still goes down. But the optimizer now reports more parameters than
the paper says, and after fine-tuning the output head and the token embedding no longer
agree. Find what the conversion did to the model, and repair it.
"""

SOLUTION = """\
`state_dict()` lists a tied tensor once per name, and `.to(torch.float64)` makes one new
tensor per name, so `load_state_dict(assign=True)` puts **two different tensors** where there
was one Parameter: `transformer.wte.weight` and `lm_head.weight` are no longer the same object
or the same memory (`compare_ties` says `tie-broken`), and `parameters()` now counts the
512-element matrix twice: 4592 instead of 4080. The overwrite flag
(`torch.__future__.set_overwrite_module_params_on_conversion(True)`) followed by
`.to(torch.float64)` breaks the tie the same way.

The repair is to point one name at the other (`model.lm_head.weight =
model.transformer.wte.weight`, which is what the model's `tie_weights()` does), or
`inspector.retie(model, snapshot)` with a snapshot taken before the conversion. Better still:
convert with `inspector.move_model`, which keeps every tie.
"""

TIED = ("transformer.wte.weight", "lm_head.weight")


def build() -> Scenario:
    from ..aliases import snapshot_ties

    loaded = load_model("sample:tiny-gpt2")
    original = copy.deepcopy(loaded.model)
    snapshot = snapshot_ties(loaded.model)
    state = {k: v.to(torch.float64) for k, v in loaded.model.state_dict().items()}
    loaded.model.load_state_dict(state, assign=True)
    loaded.name = "tiny-gpt2 (converted to float64)"
    return Scenario(loaded, {"snapshot": snapshot, "original": original})


def unique_elements(model: nn.Module) -> int:
    """Length of the flat parameter vector: what the optimizer and ``parameters()`` count."""
    from ..offsets import offset_map

    table = offset_map(model)
    return int(table["numel"].sum()) if len(table) else 0


def parameter_names(scenario: Scenario) -> list[str]:
    return [n for n, _ in scenario.model.named_parameters(remove_duplicate=False)]


def broken_groups(scenario: Scenario, model: nn.Module | None = None) -> dict[str, tuple[set[str], str]]:
    """Per finding of ``compare_ties``: the whole alias group it is about, and the code."""
    from ..aliases import alias_groups, compare_ties

    groups = [set(g.names) for g in alias_groups(scenario.extras["original"])]
    out: dict[str, tuple[set[str], str]] = {}
    for f in compare_ties(scenario.extras["snapshot"], scenario.model if model is None else model):
        if f.code not in ("tie-broken", "tie-weakened"):
            continue
        group = next((g for g in groups if f.where in g), {f.where})
        out[min(group)] = (group, f.code)
    return out


def check_group(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    found = broken_groups(scenario)
    count = unique_elements(scenario.model)
    evidence = tuple(f"compare_ties: {code} for {', '.join(sorted(g))}" for g, code in found.values())
    evidence += (f"offset_map: {count} parameter elements in parameters()",)
    if not found:
        return CheckResult(False, "The inspector finds no broken tie in this model.", evidence)
    named = set(answers["names"])
    wrong: list[str] = []
    match = next(((g, code) for g, code in found.values() if g == named), None)
    if match is None:
        wrong.append("the names you picked are not exactly one group whose tie the conversion changed"
                     " (pick every name of the group, nothing else)")
    elif answers["code"] != match[1]:
        wrong.append(f"the tie check does not call it {answers['code']!r}: think about whether the "
                     "two names still share memory")
    if answers["count"] != count:
        wrong.append(f"{answers['count']} is not the number of elements parameters() yields now")
    if wrong or match is None:
        return CheckResult(False, "Not yet: " + "; ".join(wrong) + ".")
    return CheckResult(True, f"Right: {', '.join(sorted(named))} became separate tensors "
                             f"({match[1]}), and parameters() now yields {count} elements.", evidence)


def check_retie(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    from ..aliases import alias_groups, compare_ties

    replace_name, keep_name = answers["replace"], answers["keep"]
    if replace_name == keep_name:
        return CheckResult(False, "Pick two different names: one to replace, one to keep.")
    model = copy.deepcopy(scenario.model)
    names = dict(model.named_parameters(remove_duplicate=False))
    for n in (replace_name, keep_name):
        if n not in names:
            raise InspectorError(f"{n!r} is not a parameter of the model")
    owner, _, attr = replace_name.rpartition(".")
    keep = names[keep_name]
    if tuple(keep.shape) != tuple(names[replace_name].shape):
        return CheckResult(False, f"{keep_name} has shape {tuple(keep.shape)} and {replace_name} "
                                  f"{tuple(names[replace_name].shape)}: they cannot be one tensor.")
    setattr(model.get_submodule(owner), attr, keep)
    left = [f for f in compare_ties(scenario.extras["snapshot"], model)
            if f.code in ("tie-broken", "tie-weakened")]
    count = unique_elements(model)
    tied = [
        g
        for g in alias_groups(model)
        if g.kind == "same-object" and {replace_name, keep_name} <= set(g.names)
    ]
    before = unique_elements(scenario.extras["original"])
    evidence = (
        f"after `{replace_name} = {keep_name}`: offset_map counts {count} elements "
        f"(before the conversion: {before})",
        f"compare_ties against the snapshot: {len(left)} tie finding(s)"
        + (": " + "; ".join(f"{f.code} at {f.where}" for f in left) if left else ""),
        f"alias_groups: {'one same-object group with both names' if tied else 'no group with both names'}",
    )
    if left or count != before or not tied:
        return CheckResult(False, "That re-tie does not restore the model: the inspector still sees "
                                  "a difference from before the conversion.", evidence)
    return CheckResult(True, f"Re-tied: one Parameter under both names again, {count} elements.", evidence)


def _alias_table(model: nn.Module) -> pd.DataFrame:
    from ..aliases import alias_groups

    rows = [{"names": ", ".join(g.names), "kind": g.kind, "numel": g.numel} for g in alias_groups(model)]
    return pd.DataFrame(rows, columns=["names", "kind", "numel"])


def _counts(scenario: Scenario) -> pd.DataFrame:
    rows = []
    for label, model in (("before the conversion", scenario.extras["original"]),
                         ("after the conversion", scenario.model)):
        rows.append({"model": label, "parameters() tensors": len(list(model.parameters())),
                     "parameters() elements": unique_elements(model)})
    return pd.DataFrame(rows)


def _parameters(scenario: Scenario) -> pd.DataFrame:
    """Every parameter name of the converted model, whether parameters() yields it, and its storage."""
    model = scenario.model
    yielded = {id(p) for p in model.parameters()}
    rows = [{"name": n, "shape": str(tuple(p.shape)), "dtype": str(p.dtype).removeprefix("torch."),
             "numel": p.numel(), "yielded by parameters()": id(p) in yielded,
             "storage address": hex(p.untyped_storage().data_ptr())}
            for n, p in model.named_parameters(remove_duplicate=False)]
    return pd.DataFrame(rows)


def _graphs(scenario: Scenario) -> list[Any]:
    from ..aliases import graph_data
    from ..figures.aliases import alias_graph_figure

    return [
        alias_graph_figure(graph_data(scenario.extras["original"])),
        alias_graph_figure(graph_data(scenario.model)),
    ]


def _tie_findings(scenario: Scenario) -> pd.DataFrame:
    from ..aliases import compare_ties

    rows = [f.to_dict() for f in compare_ties(scenario.extras["snapshot"], scenario.model)]
    return pd.DataFrame(rows, columns=["code", "severity", "where", "message"])


LAB = Lab(
    id="broken-tie",
    title="The broken tie",
    story=STORY,
    build=build,
    tasks=(
        Task(
            id="name-group",
            prompt="Which alias group did the conversion change, what does the tie check call it, "
                   "and how many elements does `parameters()` yield now?",
            fields=(
                Field("names", "Names of the group", "multi", parameter_names),
                Field("code", "Finding code", "choice", ("tie-broken", "tie-weakened")),
                Field("count", "Elements in parameters() now", "number"),
            ),
            check=check_group,
            hints=("Compare the alias groups before and after the conversion.",
                   "`tie-broken` means the names no longer share memory, `tie-weakened` that they do but "
                   "as separate objects: compare their storage addresses in the parameter table.",
                   "Add up the numel of every row parameters() yields: the 32x16 embedding now counts "
                   "twice."),
            solution={"names": list(TIED), "code": "tie-broken", "count": 4592},
        ),
        Task(
            id="retie",
            prompt="Repair the model: make one name point at the other's Parameter, so that the "
                   "tie check finds nothing and the count is back to what it was.",
            fields=(
                Field("replace", "Replace this name…", "choice", parameter_names),
                Field("keep", "…with the Parameter under this name", "choice", parameter_names),
            ),
            check=check_retie,
            hints=("A tie is one Parameter object registered under two names.",
                   "`model.lm_head.weight = model.transformer.wte.weight` is one way."),
            solution={"replace": "lm_head.weight", "keep": "transformer.wte.weight"},
        ),
    ),
    views=(
        View("Alias groups before the conversion", lambda s: _alias_table(s.extras["original"])),
        View("Alias groups after the conversion", lambda s: _alias_table(s.model),
             "An empty table means no two names share a tensor."),
        View("Parameters of the converted model", _parameters,
             "Every registered name; parameters() yields each tensor once, under its first name."),
        View("Element counts", _counts, "What parameters() and the optimizer count.", after="name-group"),
        View("Tie check: snapshot before vs model after", _tie_findings,
             "compare_ties(snapshot taken before the conversion, model now).", on_demand=True,
             after="name-group"),
        View("Alias graphs: before, then after the conversion", _graphs,
             "Tensors aliased by two names are drawn in one colour.", on_demand=True),
    ),
    solution=SOLUTION,
)
