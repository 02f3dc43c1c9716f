"""Column lists and typed table building."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from ..utils.labels import ROOT_LABEL

OFFSET_COLUMNS = ["name", "aliases", "module", "start", "end", "numel", "shape", "dtype",
                  "device", "requires_grad", "kind"]
PARAMETER_NORM_COLUMNS = ["name", "norm", "state", "nan", "inf", "numel", "dtype", "device",
                          "requires_grad"]
MODULE_NORM_COLUMNS = ["name", "norm", "state", "nan", "inf", "numel", "parameters", "ok", "none",
                       "frozen", "nonfinite", "depth", "owns_parameters", "own_norm"]
STATES = ("ok", "none", "frozen", "nonfinite")
ROOT = ROOT_LABEL

_INT_COLUMNS = {"start", "end", "numel", "nan", "inf", "parameters", "ok", "none", "frozen",
                "nonfinite", "depth"}

Named = list[tuple[str, torch.Tensor]]


def frame(columns: list[str], rows: list[tuple]) -> pd.DataFrame:
    """A table of ``rows`` (tuples in ``columns`` order) with numpy dtypes set per column."""
    values_by_column: list[Any] = list(zip(*rows, strict=True)) if rows else [[] for _ in columns]
    data: dict[str, Any] = {}
    for col, values in zip(columns, values_by_column, strict=True):
        if col in _INT_COLUMNS:
            data[col] = np.asarray(values, dtype=np.int64)
        elif col in ("requires_grad", "owns_parameters"):
            data[col] = np.asarray(values, dtype=bool)
        elif col in ("norm", "own_norm"):
            data[col] = np.asarray(values, dtype=np.float64)
        else:
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            data[col] = arr
    return pd.DataFrame(data, columns=columns, copy=False)


def label(cache: dict[Any, str], key: Any) -> str:
    """``str(key)`` without a ``torch.`` prefix, computed once per distinct dtype or device."""
    text = cache.get(key)
    if text is None:
        text = cache[key] = str(key).removeprefix("torch.")
    return text
