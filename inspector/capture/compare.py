"""How far a live tensor is from its copy, and how far bare references drifted from the copies."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import torch

from .leaves import tensor_leaves
from .storage import MEMCPY_BYTES

DRIFT_COLUMNS = ["module", "max_abs_diff", "corrupted", "overwritten_by"]


def reference_drift(captures: Any) -> pd.DataFrame:
    """Per captured module: the largest difference between the copy and the bare reference.

    Columns: module, max_abs_diff (None without a reference), corrupted (the bare reference
    no longer holds what the module output), overwritten_by. Needs a capture made with
    ``keep_references=True`` for the differences.

    >>> from torch import nn
    >>> from inspector.capture import capture_activations
    >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    >>> _ = nn.init.constant_(net[0].weight, -1.0)
    >>> _ = nn.init.constant_(net[0].bias, 0.0)
    >>> drift = reference_drift(capture_activations(net, torch.ones(1, 2), keep_references=True))
    >>> drift[["module", "max_abs_diff", "corrupted"]].values.tolist(), drift["overwritten_by"][0]
    ([['0', 2.0, True], ['1', 0.0, False]], '1')
    """
    rows = []
    for key in captures.order:
        ref = captures.references.get(key)
        diff = None
        if ref is not None:
            refs = dict(tensor_leaves(ref))
            diffs = [max_abs_change(refs[p], t) for p, t in tensor_leaves(captures.outputs[key]) if p in refs]
            found = [d for d in diffs if d is not None]
            diff = max(found) if found else None
        rows.append({"module": key, "max_abs_diff": diff,
                     "corrupted": bool(diff) or key in captures.mutated,
                     "overwritten_by": captures.mutated.get(key)})
    return pd.DataFrame(rows, columns=DRIFT_COLUMNS)


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool | None:
    """Whether two contiguous CPU tensors hold the same bytes (one single-threaded pass);
    None when that cannot be checked this way."""
    if a.device.type != "cpu" or not (a.is_contiguous() and b.is_contiguous()) or a.numel() == 0 \
            or a.is_conj() or b.is_conj() or a.is_neg() or b.is_neg():
        return None
    try:
        x = a.reshape(-1).view(torch.uint8).numpy()
        y = b.reshape(-1).view(torch.uint8).numpy()
        if x.size % 8 == 0:
            x, y = x.view(np.int64), y.view(np.int64)
        return bool(np.array_equal(x, y))
    except (RuntimeError, TypeError, ValueError):
        return None


def max_abs_change(live: torch.Tensor, copy: torch.Tensor) -> float | None:
    """Largest absolute difference between the live tensor and its copy (NaN == NaN)."""
    if live.device == copy.device and live.shape == copy.shape and live.dtype == copy.dtype \
            and live.numel() * live.element_size() < MEMCPY_BYTES:
        try:  # the common case (a pass-through output, unchanged): one small compare, no temporaries
            if torch.equal(live, copy):
                return 0.0
        except RuntimeError:
            pass
    try:
        with torch.inference_mode(False), torch.no_grad():
            a = live.detach().to(copy.device)
            if a.shape != copy.shape or a.dtype != copy.dtype:
                return math.inf
            same = same_bytes(a, copy)
            if same or (same is None and torch.equal(a, copy)):
                return 0.0
            if a.is_floating_point() or a.is_complex():
                diff = (a - copy).abs()  # in the tensors' own precision: no float64 temporaries
                if not bool(torch.isfinite(diff).all()):
                    both_nan = torch.isnan(a) & torch.isnan(copy)
                    diff = torch.nan_to_num(diff.masked_fill_(both_nan, 0), nan=math.inf)
                return float(diff.max())
            return float((a.double() - copy.double()).abs().max())
    except RuntimeError:
        return None
