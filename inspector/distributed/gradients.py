"""Gradient norms of a model whose parameters are DTensors: global (as ``clip_grad_norm_``) and local.

``inspector.offsets.gradient_report`` hands DTensor models to :func:`dtensor_gradient_report`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
from torch import nn

from ..findings import Finding, InspectorError
from ..offsets import MODULE_NORM_COLUMNS, PARAMETER_NORM_COLUMNS, ROOT, GradientNorms
from .analyses import global_gradient_rows
from .findings import nonfinite_by_rank

DTENSOR_NORM_COLUMNS = ["local_norm", "placements", "nonfinite_ranks"]


def dtensor_gradient_report(model: nn.Module, grads: Mapping[str, Any] | None = None) -> GradientNorms:
    """Per-parameter and per-module gradient norms of a sharded model, in one collective.

    ``norm`` is the global L2 norm (the total equals ``torch.nn.utils.clip_grad_norm_``'s on
    the same model); ``local_norm`` is this rank's piece; ``nan``/``inf`` count over all
    ranks and ``nonfinite_ranks`` names the ranks whose piece holds them. Every rank must
    call it at the same time.

    Raises:
        InspectorError: ``grads`` is given: gradients of a sharded model are read from ``.grad``.
    """
    if grads is not None:
        raise InspectorError(
            "gradients passed explicitly are not read for a model with DTensor parameters (FSDP2, tensor "
            "parallel): its gradients are measured from each parameter's .grad on every rank. Leave grads "
            "out, after loss.backward() on every rank.")
    rows, rank, _ = global_gradient_rows(model)
    aliases: dict[str, list[str]] = {}
    by_id: dict[int, str] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        first = by_id.setdefault(id(p), name)
        aliases.setdefault(first, []).append(name)
    prows = []
    for r in rows:
        has = r["has_grad"]
        nan, inf = sum(r["nan"]), sum(r["inf"])
        norm = r["grad_norm"] if r["grad_norm"] is not None else math.nan
        if has and (nan or inf):
            norm = math.nan
        state = ("frozen" if not r["requires_grad"] else "nonfinite" if nan or inf
                 else "ok" if has else "none")
        local_norm = r["local_grad_norm"][rank]
        prows.append({"name": r["name"], "norm": norm, "state": state, "nan": nan, "inf": inf,
                      "numel": r["numel"], "dtype": r["dtype"], "device": "", "requires_grad": r["requires_grad"],
                      "local_norm": math.nan if local_norm is None else local_norm,
                      "placements": r["placements"],
                      "nonfinite_ranks": tuple(k for k, (a, b) in enumerate(zip(r["nan"], r["inf"])) if a or b)})
    devices = {n: str(p.device) for n, p in model.named_parameters()}
    for row in prows:
        row["device"] = devices.get(row["name"], "")
    by_parameter = pd.DataFrame(prows, columns=PARAMETER_NORM_COLUMNS + DTENSOR_NORM_COLUMNS)
    by_module = _by_module(prows, aliases)
    findings: list[Finding] = []
    for r in rows:
        findings += nonfinite_by_rank(r)
    if prows and all(r["state"] in ("none", "frozen") for r in prows) and any(r["requires_grad"] for r in prows):
        findings.append(Finding("no-gradients", "warning", "",
                                "no trainable parameter has a gradient yet: run a backward pass on every rank"))
    total = float(by_module["norm"].iloc[0]) if len(by_module) else math.nan
    return GradientNorms(by_parameter, by_module, findings, total)


def _prefixes(holder: str) -> list[str]:
    parts = holder.split(".") if holder else []
    return [".".join(parts[:k]) for k in range(len(parts) + 1)]


def _by_module(prows: list[dict], aliases: dict[str, list[str]]) -> pd.DataFrame:
    """Sum of squares by every module prefix (each tensor once per module), as ``gradient_report``."""
    acc: dict[str, dict] = {}
    for r in prows:
        holders = list(dict.fromkeys(a.rpartition(".")[0] for a in aliases.get(r["name"], [r["name"]])))
        has = r["state"] in ("ok", "nonfinite")
        sq = r["norm"] ** 2 if has else 0.0
        prefixes = dict.fromkeys(p for h in holders for p in _prefixes(h))
        for prefix in prefixes:
            a = acc.setdefault(prefix, {"sq": 0.0, "nan": 0, "inf": 0, "numel": 0, "parameters": 0, "ok": 0,
                                        "none": 0, "frozen": 0, "nonfinite": 0, "grads": 0, "own": None})
            a["sq"] += sq
            a["nan"] += r["nan"]
            a["inf"] += r["inf"]
            a["numel"] += r["numel"]
            a["parameters"] += 1
            a[r["state"]] += 1
            a["grads"] += has
        for h in holders:
            own = acc[h]["own"] or [0.0, 0]
            own[0] += sq
            own[1] += has
            acc[h]["own"] = own
    rows = []
    for prefix, a in acc.items():
        state = "nonfinite" if a["nonfinite"] else "ok" if a["ok"] else "none" if a["none"] else "frozen"
        own = a["own"]
        rows.append((prefix or ROOT, math.sqrt(a["sq"]) if a["grads"] else math.nan, state, a["nan"], a["inf"],
                     a["numel"], a["parameters"], a["ok"], a["none"], a["frozen"], a["nonfinite"],
                     0 if not prefix else prefix.count(".") + 1, own is not None,
                     math.sqrt(own[0]) if own is not None and own[1] else math.nan))
    frame = pd.DataFrame(rows, columns=MODULE_NORM_COLUMNS)
    for col in ("nan", "inf", "numel", "parameters", "ok", "none", "frozen", "nonfinite", "depth"):
        frame[col] = np.asarray(frame[col], dtype=np.int64)
    return frame
