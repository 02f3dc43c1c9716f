"""Our plan next to accelerate's ``infer_auto_device_map`` for one budget, audited side by side."""

from __future__ import annotations

import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..utils.checks import require_module
from ..utils.findings import Finding
from .audits import audit_inventory, device_usage, normalise_map
from .budget import Device, parse_max_memory
from .plan import PlacementPlan, default_no_split, explain, plan_steps


@dataclass(frozen=True)
class Comparison:
    """Our plan and accelerate's ``infer_auto_device_map`` for one budget, audited side by side.

    ``difference`` has a row for each tensor name whose device or finding differs: ``name,
    kind, ours, accelerate, our_finding, accelerate_finding``. ``*_check`` is None when
    ``accelerate.utils.check_device_map`` accepts the map, else its error message.
    ``accelerate_error`` is None when accelerate planned, else what it raised: its map is then
    empty, its audit leaves every tensor without a device, and ``difference`` is empty.
    """

    ours: PlacementPlan
    accelerate_map: dict[str, Device]
    accelerate_audit: pd.DataFrame = field(repr=False)
    accelerate_findings: list[Finding]
    accelerate_usage: pd.DataFrame = field(repr=False)
    difference: pd.DataFrame = field(repr=False)
    our_check: str | None
    accelerate_check: str | None
    our_seconds: float
    accelerate_seconds: float
    accelerate_error: str | None = None


def check_with_accelerate(model: nn.Module, device_map: Mapping[str, Any]) -> str | None:
    """None if ``accelerate.utils.check_device_map`` accepts the map, else its message.

    Its warning about keys that are tensor names (not modules) is expected for split modules
    and is not reported.

    >>> check_with_accelerate(nn.Linear(2, 2), {"weight": "cpu"})
    'The device_map provided does not give any device for the following parameters: bias'
    """
    from accelerate.utils import check_device_map

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            check_device_map(model, dict(device_map))
    except ValueError as exc:
        return str(exc)
    return None


def accelerate_budget(budget: Mapping[Device, int]) -> dict[int | str, int]:
    """A budget in the form accelerate's ``max_memory`` takes (a fresh dict: accelerate edits it).

    >>> accelerate_budget(parse_max_memory("0=1KiB,cpu=2KiB"))
    {0: 1024, 'cpu': 2048}
    """
    return {d: int(n) for d, n in budget.items()}


def compare_with_accelerate(model: nn.Module, max_memory: str | Mapping[Any, Any],
                            no_split_module_classes: Iterable[str] | str | None = None,
                            dtype: torch.dtype | str | None = None) -> Comparison:
    """Plan with ours and with accelerate's ``infer_auto_device_map``; audit both; diff them.

    accelerate always allows a disk device after the ones in the budget; ours uses disk only
    when the budget names it.

    >>> from sample_models import get_sample
    >>> c = compare_with_accelerate(get_sample("split-block").build(), "0=40000,1=40000,cpu=100000")
    >>> sorted(c.accelerate_audit.loc[c.accelerate_audit["device"].isna(), "name"])
    ['block.pos_table', 'block.scale']
    """
    from accelerate import infer_auto_device_map

    model = require_module(model, "compare_with_accelerate")
    budget = parse_max_memory(max_memory)
    no_split = default_no_split(model, no_split_module_classes)
    t0 = time.perf_counter()
    planned = plan_steps(model, budget, no_split, dtype)
    t1 = time.perf_counter()
    try:
        theirs = normalise_map(
            dict(
                infer_auto_device_map(
                    model,
                    max_memory=accelerate_budget(budget),
                    no_split_module_classes=list(no_split),
                    dtype=dtype,
                )
            )
        )
        error = None
    except Exception as exc:  # noqa: BLE001 - accelerate's planner fails on some models; ours still stands
        theirs, error = {}, f"{type(exc).__name__}: {exc}"
    t2 = time.perf_counter()
    ours = explain(model, planned)
    result = audit_inventory(planned.inv.inventory, theirs)
    usage = device_usage(result.table, budget)
    if error is not None:
        failed = Finding("accelerate-failed", "warning", "",
                         f"accelerate's infer_auto_device_map could not plan this model ({error}); "
                         "only our plan is shown")
        return Comparison(
            ours,
            theirs,
            result.table,
            [failed],
            usage,
            _difference([], ours.audit, result.table),
            check_with_accelerate(model, ours.device_map),
            error,
            t1 - t0,
            t2 - t1,
            error,
        )
    a, b = ours.audit.set_index("name"), result.table.set_index("name")
    differs = [n for n in a.index if a.at[n, "device"] != b.at[n, "device"]
               or a.at[n, "finding"] != b.at[n, "finding"]]
    return Comparison(ours, theirs, result.table, result.findings, usage, _difference(differs, a, b),
                      check_with_accelerate(model, ours.device_map), check_with_accelerate(model, theirs),
                      t1 - t0, t2 - t1)


def _difference(differs: list[str], a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"name": differs, "kind": [a.at[n, "kind"] for n in differs],
                         "ours": [a.at[n, "device"] for n in differs],
                         "accelerate": [b.at[n, "device"] for n in differs],
                         "our_finding": [a.at[n, "finding"] for n in differs],
                         "accelerate_finding": [b.at[n, "finding"] for n in differs]}).astype(object)
