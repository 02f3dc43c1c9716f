"""One step's numbers as the row the run file keeps (:class:`~inspector.runfiles.StepRecord`)."""

from __future__ import annotations

import math
import time

import numpy as np

from ..runfiles import StepRecord
from ..utils.findings import Finding
from .numbers import Numbers


def _opt(value: float) -> float | None:
    return None if math.isnan(value) else float(value)


def _int(value: float) -> int | None:
    return None if math.isnan(value) else int(value)


def _all_nan(values: np.ndarray) -> bool:
    return np.count_nonzero(values == values) == 0  # no value equal to itself: every one is NaN


def step_record(step: int, rank: int, n: Numbers, scalars: dict[str, float], lrs: list[float],
            findings: list[Finding]) -> StepRecord:
    f32 = np.float32
    return StepRecord(
        step=step, rank=rank, time=time.time(), step_time=_opt(n.step_time),
        loss=float(n.loss) if n.loss_logged else None,
        grad_norm=_opt(n.grad_norm), nonfinite=int(n.nonfinite), lr=lrs, scale=_opt(n.scale),
        skipped=bool(n.skipped), device_allocated=_int(n.device_allocated), device_peak=_int(n.device_peak),
        rss=_int(n.rss), scalar_names=list(scalars),
        scalar_values=[float(v) for v in scalars.values()] if scalars else [],
        module_grad_norm=n.module_grad.astype(f32),
        module_param_norm=None if _all_nan(n.module_param) else n.module_param.astype(f32),
        module_update_ratio=None if _all_nan(n.module_update) else n.module_update.astype(f32),
        module_nonfinite=np.nan_to_num(n.module_nonfinite).astype(np.int32) if n.nonfinite else
        np.zeros(len(n.module_nonfinite), dtype=np.int32),  # no NaN/Inf element: each module's count is 0
        param_grad_norm=n.param_grad.astype(f32),
        findings=[f.to_dict() for f in findings] if findings else [])
