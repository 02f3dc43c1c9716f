"""One step's numbers as the row the run file keeps (:class:`~inspector.runfiles.StepRecord`)."""

from __future__ import annotations

import time

import numpy as np

from ..runfiles import StepRecord
from ..utils.findings import Finding
from .numbers import Numbers


def _all_nan(values: np.ndarray) -> bool:
    return np.count_nonzero(values == values) == 0  # no value equal to itself: every one is NaN


def step_record(step: int, rank: int, n: Numbers, scalars: dict[str, float], lrs: list[float],
            findings: list[Finding]) -> StepRecord:
    # NaN (``v != v``) where a number was not taken: None in the row
    step_time, grad_norm, scale = n.step_time, n.grad_norm, n.scale
    allocated, peak, rss = n.device_allocated, n.device_peak, n.rss
    return StepRecord(
        step=step, rank=rank, time=time.time(),
        step_time=None if step_time != step_time else float(step_time),
        loss=float(n.loss) if n.loss_logged else None,
        grad_norm=None if grad_norm != grad_norm else float(grad_norm), nonfinite=int(n.nonfinite), lr=lrs,
        scale=None if scale != scale else float(scale), skipped=bool(n.skipped),
        device_allocated=None if allocated != allocated else int(allocated),
        device_peak=None if peak != peak else int(peak), rss=None if rss != rss else int(rss),
        scalar_names=list(scalars),
        scalar_values=[float(v) for v in scalars.values()] if scalars else [],
        # (the float64 arrays as they are: the run file's writer makes each column float32 at once)
        module_grad_norm=n.module_grad,
        module_param_norm=None if _all_nan(n.module_param) else n.module_param,
        module_update_ratio=None if _all_nan(n.module_update) else n.module_update,
        module_nonfinite=np.nan_to_num(n.module_nonfinite).astype(np.int32) if n.nonfinite else
        np.zeros(len(n.module_nonfinite), dtype=np.int32),  # no NaN/Inf element: each module's count is 0
        param_grad_norm=n.param_grad,
        findings=[f.to_dict() for f in findings] if findings else [])
