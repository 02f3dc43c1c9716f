"""Value statistics of captured tensors, computed after the forward pass (never in a hook)."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import torch

from .leaves import tensor_leaves

STATS_COLUMNS = ["module", "kind", "path", "shape", "dtype", "device", "bytes", "mean", "std", "min",
                 "max", "nan", "inf", "zero_fraction", "mutated"]


def stats_frame(stores: dict[str, dict[str, Any]], mutated: dict[str, Any]) -> pd.DataFrame:
    """One row per tensor leaf of ``stores`` (kind -> module -> captured value), in order.

    >>> stats_frame({"output": {"relu": torch.tensor([0.0, 2.0])}}, {})["mean"].tolist()
    [1.0]
    """
    rows = []
    for kind, store in stores.items():
        for module, value in store.items():
            for path, t in tensor_leaves(value):
                rows.append({"module": module, "kind": kind, "path": path, **tensor_stats(t),
                             "mutated": kind == "output" and module in mutated})
    return pd.DataFrame(rows, columns=STATS_COLUMNS)


def tensor_stats(t: torch.Tensor) -> dict[str, Any]:
    """Shape, dtype, device, bytes and value statistics of one tensor.

    Mean, std, min and max are over the finite values; ``nan``/``inf`` count the others.

    >>> s = tensor_stats(torch.tensor([0.0, 2.0, float("nan")]))
    >>> s["mean"], s["nan"], s["zero_fraction"]
    (1.0, 1, 0.3333333333333333)
    """
    n = t.numel()
    row: dict[str, Any] = {"shape": str(tuple(t.shape)), "dtype": str(t.dtype).removeprefix("torch."),
                           "device": str(t.device), "bytes": n * t.element_size(), "mean": None,
                           "std": None, "min": None, "max": None, "nan": 0, "inf": 0,
                           "zero_fraction": None}
    if n == 0 or t.device.type == "meta":
        return row
    x = t.detach()
    if x.is_complex():
        x = x.abs()
    x = x.double() if not x.is_floating_point() or x.dtype == torch.float64 else x.float()
    flat = x.reshape(-1)
    total = flat.sum()
    if bool(torch.isfinite(total)):  # a NaN or Inf anywhere would make the sum non-finite
        zeros = n - int(torch.count_nonzero(flat))
        mean = float(total) / n
        mean_sq = float(torch.dot(flat, flat)) / n  # one pass each, no temporaries
        var = mean_sq - mean * mean
        if math.isfinite(mean_sq) and var > 1e-3 * mean_sq:
            std = math.sqrt(var)
        else:  # heavy cancellation (|mean| >> std) or overflow: the exact two-pass formula
            std_t, mean_t = torch.std_mean(flat, correction=0)
            std, mean = float(std_t), float(mean_t)
        lo, hi = torch.aminmax(flat)
        row.update(zero_fraction=zeros / n, mean=mean, std=std, min=float(lo), max=float(hi))  # nan, inf: 0
        return row
    nan, inf = int(torch.isnan(flat).sum()), int(torch.isinf(flat).sum())
    x = flat[torch.isfinite(flat)]
    row.update(nan=nan, inf=inf, zero_fraction=(n - int(torch.count_nonzero(x)) - nan - inf) / n)
    if x.numel():
        std_x, mean_x = torch.std_mean(x, correction=0)
        lo, hi = torch.aminmax(x)
        row.update(mean=float(mean_x), std=float(std_x), min=float(lo), max=float(hi))
    return row
