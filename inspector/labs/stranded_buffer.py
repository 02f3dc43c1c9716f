"""Lab: the stranded buffer — accelerate splits a block and leaves its own buffers out of the map."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..loading.models import load_model
from .core import CheckResult, Field, Lab, Scenario, Task, View

# split-block in float32 (bytes): embed 16640, block.fc1/fc2/fc3 16640 each, block.scale 256,
# block.pos_table 4096, head 2080. With 50000 bytes of CPU, accelerate puts embed and
# block.fc1 on the CPU, block.fc2, block.fc3 and head on disk: the block is split, and its
# two direct buffers get no device at all. Two of its three Linears are on disk, so disk is the
# block's primary device.
MAX_MEMORY: dict[str | int, int] = {"cpu": 50_000, "disk": 1_000_000_000}
BUFFERS = ("block.scale", "block.pos_table")

STORY = """\
A colleague runs `split-block` on a laptop with little memory and lets accelerate plan the
placement, offloading to disk what does not fit:

```python
device_map = infer_auto_device_map(model, max_memory={"cpu": 50_000, "disk": 10**9})
model = dispatch_model(model, device_map, offload_dir="offload")
```

Every parameter has a device in the map. `dispatch_model` then complains — or, on another
machine, the forward pass fails with *"Expected all tensors to be on the same device"*.
The map looks complete. What is missing, and what should the map be?
"""

SOLUTION = """\
`infer_auto_device_map` splits `block` (its three Linears do not fit together) and then maps
the block's children one by one. Tensors the block owns **directly** — the buffers
`block.scale` and `block.pos_table` — belong to no child, so the map has no entry for them:
`audit_device_map` reports `buffer-unplaced` for both, and accelerate's own
`check_device_map` rejects the map. Give each a device; the best one is the block's primary
device (the one holding most of its parameter bytes: `disk`, where fc2 and fc3 are).
`inspector.plan_device_map(model, max_memory)` does this for every split module.
"""


def build() -> Scenario:
    from accelerate import infer_auto_device_map

    loaded = load_model("sample:split-block")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        device_map = dict(infer_auto_device_map(loaded.model, max_memory=dict(MAX_MEMORY)))
    return Scenario(loaded, {"device_map": device_map, "max_memory": dict(MAX_MEMORY)})


def tensor_names(scenario: Scenario) -> list[str]:
    m = scenario.model
    return [n for n, _ in m.named_parameters()] + [n for n, _ in m.named_buffers()]


def _audit(scenario: Scenario, device_map: Mapping[str, Any]) -> pd.DataFrame:
    from ..placement import audit_device_map

    return audit_device_map(scenario.model, dict(device_map))


def _findings(table: pd.DataFrame) -> dict[str, str]:
    if "finding" not in table:
        return {}
    return {str(r["name"]): str(r["finding"]) for _, r in table.iterrows()
            if isinstance(r["finding"], str) and r["finding"]}


def check_missing(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    table = _audit(scenario, scenario.extras["device_map"])
    unplaced = {str(r["name"]) for _, r in table.iterrows() if r["device"] is None or pd.isna(r["device"])}
    named = set(answers["names"])
    if named != unplaced:
        extra, missed = named - unplaced, unplaced - named
        bits = ([f"{len(missed)} unplaced tensor(s) not named"] if missed else []) + \
               ([f"{', '.join(sorted(extra))} do(es) have a device"] if extra else [])
        return CheckResult(False, "Not yet: " + "; ".join(bits) + ".")
    kinds = {str(r["kind"]) for _, r in table.iterrows() if str(r["name"]) in unplaced}
    return CheckResult(True, f"Right: {', '.join(sorted(unplaced))} have no device in the map.",
                       (f"audit_device_map: no device for {', '.join(sorted(unplaced))} "
                        f"(kind: {', '.join(sorted(kinds))})",))


def check_map(scenario: Scenario, answers: Mapping[str, Any]) -> CheckResult:
    from accelerate.utils import check_device_map

    device_map = answers["device_map"]
    try:
        with warnings.catch_warnings():  # accelerate warns about tensor-level keys it accepts
            warnings.simplefilter("ignore")
            check_device_map(scenario.model, device_map)
    except ValueError as exc:
        return CheckResult(False, "accelerate's check_device_map rejects this map.",
                           (f"check_device_map: {exc}",))
    table = _audit(scenario, device_map)
    over = _budget_problems(scenario, table)
    if over:
        return CheckResult(False, "The map does not fit the story's budget: " + "; ".join(over) + ".",
                           ("check_device_map: passed", "bytes per device: " + _usage_line(table)))
    found = _findings(table)
    problems = {n: f for n, f in found.items()
                if any(code in f for code in ("unplaced", "unknown-key", "tie-split", "stranded"))}
    evidence = ("check_device_map: passed",
                "audit_device_map: " + ("; ".join(f"{n}: {f}" for n, f in sorted(problems.items()))
                                        if problems else "every parameter and buffer placed, none stranded"))
    if problems:
        return CheckResult(False, "The map passes check_device_map, but the audit still finds "
                                  "a problem: put each buffer with the bulk of its module.", evidence)
    return CheckResult(True, "The map covers every tensor within the budget, and each buffer sits with "
                             "its module.", (*evidence, "bytes per device: " + _usage_line(table)))


def _usage(table: pd.DataFrame) -> dict[str, int]:
    """Bytes the map puts on each device (from the audit: one row per parameter and buffer)."""
    placed = table[table["device"].notna()]
    return {str(d): int(b) for d, b in placed.groupby(placed["device"].astype(str))["bytes"].sum().items()}


def _usage_line(table: pd.DataFrame) -> str:
    return ", ".join(f"{d} {b:,}" for d, b in sorted(_usage(table).items()))


def _budget_problems(scenario: Scenario, table: pd.DataFrame) -> list[str]:
    """What breaks the story's budget: a device it does not have, a device over its bytes, or the CPU
    left emptier than accelerate left it (the story offloads to disk only what does not fit)."""
    budget = {str(k): int(v) for k, v in scenario.extras["max_memory"].items()}
    used = _usage(table)
    out = [f"{f'GPU {d}' if d.isdigit() else d} is not a device of this laptop (it has {', '.join(budget)})"
           for d in used if d not in budget]
    out += [f"{d} would hold {b:,} bytes, over its {budget[d]:,}" for d, b in sorted(used.items())
            if d in budget and b > budget[d]]
    cpu_before = _usage(_accelerate_audit(scenario)).get("cpu", 0)
    if not out and used.get("cpu", 0) < cpu_before:
        out.append(f"the CPU holds {used.get('cpu', 0):,} bytes where accelerate fitted {cpu_before:,}: "
                   "offload to disk only what does not fit")
    return out


def _treemap(scenario: Scenario) -> Any:
    from ..figures.placement import placement_treemap

    return placement_treemap(_accelerate_audit(scenario), title="accelerate's map, by module")


def _default_map(scenario: Scenario) -> str:
    return json.dumps(scenario.extras["device_map"], indent=1)


def _solution_map(scenario: Scenario) -> dict[str, Any]:
    from ..placement import plan_device_map

    plan = plan_device_map(scenario.model, dict(scenario.extras["max_memory"]))
    return {"device_map": json.dumps(plan, indent=1)}


def _accelerate_audit(scenario: Scenario) -> pd.DataFrame:
    return _audit(scenario, scenario.extras["device_map"])


def _audit_view(scenario: Scenario) -> pd.DataFrame:
    """The audit without the device each module should use: that is the next task's question."""
    return _accelerate_audit(scenario)[["name", "kind", "module", "device", "split", "finding", "bytes"]]


def _tensors(scenario: Scenario) -> pd.DataFrame:
    """The model's own facts: every parameter and buffer, its owner and its bytes (no map involved)."""
    return _accelerate_audit(scenario)[["name", "kind", "module", "bytes"]]


LAB = Lab(
    id="stranded-buffer",
    title="The stranded buffer",
    story=STORY,
    build=build,
    tasks=(
        Task(
            id="missing",
            prompt="Which tensors have no device in accelerate's map?",
            fields=(Field("names", "Tensors without a device", "multi", tensor_names),),
            check=check_missing,
            hints=("A key of the map covers a module and everything below it: check every row of the "
                   "table of parameters *and buffers* against the keys.",
                   "Look at the module that was split, and at the tensors it owns itself."),
            solution={"names": list(BUFFERS)},
        ),
        Task(
            id="fix-map",
            prompt="Write a device map (JSON: module or tensor name -> device) that accelerate's "
                   "`check_device_map` accepts, that leaves no buffer stranded, and that keeps the "
                   "budget: at most 50,000 bytes on the CPU, the rest on disk, and nothing offloaded "
                   "that fits on the CPU.",
            fields=(Field("device_map", "Device map (JSON)", "json", default=_default_map),),
            check=check_map,
            hints=("Start from accelerate's map and add the two missing names.",
                   "Which device holds most of block's parameter bytes? Its buffers belong there.",
                   "Add up the bytes per device: the CPU may hold 50,000, and what fits there stays there."),
            solution=_solution_map,
        ),
    ),
    views=(
        View("accelerate's map", lambda s: pd.DataFrame(
            [{"key": k, "device": str(v)} for k, v in s.extras["device_map"].items()])),
        View("Every parameter and buffer of the model", _tensors,
             "What a complete map must give a device, with the module that owns each tensor."),
        View("Budget", lambda s: pd.DataFrame([{"device": str(k), "bytes": v}
                                               for k, v in s.extras["max_memory"].items()])),
        View("Audit of accelerate's map (every parameter and buffer)", _audit_view, after="missing"),
        View("accelerate's map as a treemap", _treemap,
             "Boxes sized by bytes and coloured by device; a tensor with a finding is red.", after="missing"),
    ),
    solution=SOLUTION,
)
