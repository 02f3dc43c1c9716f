"""The same zoo under the tools people use instead of the watch, each in the watch's place
(plain-loop bugs only; each needs hooks of its own in the stacks):

- ``torch.autograd.detect_anomaly``: caught when it raises (a backward op that made NaN/Inf);
- ``transformers``' ``DebugUnderflowOverflow``: caught when it raises (a forward output with
  NaN/Inf; it works on any ``nn.Module``);
- Keras-style ``TerminateOnNaN``: caught at the first step whose loss is NaN/Inf;
- TensorBoard scalars (the loss and the global gradient norm, written each step): "visible" at
  the first step where either is NaN/Inf or over 10x the median of its previous 20 finite values
  (after 5 of them): what a person scanning the two curves would notice. None names a module.

Each counts as caught when it fires at a step in [planted - 1, planted + 1 + grace]."""

from __future__ import annotations

import contextlib
import io
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from .core import Case, Ctx, Judged
from .runner import one_line, run_case


class _Stop(Exception):
    pass


class Baseline:
    name = ""

    def __init__(self, ctx: Ctx, model: torch.nn.Module, optimizer: Any, **extra: Any) -> None:
        self.ctx, self.model = ctx, model
        ctx.step_of = lambda: ctx.i
        ctx.results.append(self)
        self.fired: int | None = None
        self.findings: list[Any] = []

    def fire(self) -> None:
        if self.fired is None:
            self.fired = self.ctx.i

    @contextmanager
    def active(self) -> Iterator[Baseline]:
        try:
            with self.scope():
                yield self
        except _Stop:
            pass

    @contextmanager
    def scope(self) -> Iterator[None]:
        yield

    def log(self, loss: torch.Tensor) -> None:
        pass


class Anomaly(Baseline):
    name = "detect_anomaly"

    @contextmanager
    def scope(self) -> Iterator[None]:
        try:
            with torch.autograd.detect_anomaly(check_nan=True):
                yield
        except RuntimeError as e:
            if "nan" not in str(e).lower() and "anomaly" not in str(e).lower():
                raise
            self.fire()


class Underflow(Baseline):
    name = "DebugUnderflowOverflow"

    @contextmanager
    def scope(self) -> Iterator[None]:
        from transformers.debug_utils import DebugUnderflowOverflow

        DebugUnderflowOverflow(self.model)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                yield
        except ValueError as e:
            if "inf/nan" not in str(e):
                raise
            self.fire()


class Scalars(Baseline):
    """TerminateOnNaN and TensorBoard scalars together: both only read the loss (and the gradient
    norm), so one run gives both; neither changes the run before it fires."""

    name = "scalars"

    def __init__(self, *a: Any, **k: Any) -> None:
        super().__init__(*a, **k)
        self.losses: list[float] = []
        self.norms: list[float] = []
        self.nan_at: int | None = None

    @contextmanager
    def scope(self) -> Iterator[None]:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.dirname(self.ctx.path))
        try:
            yield
        finally:
            self.writer.close()

    def log(self, loss: torch.Tensor) -> None:
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        norm = float(torch.nn.utils.get_total_norm(grads)) if grads else 0.0
        value = float(loss)
        self.writer.add_scalar("loss", value, self.ctx.i)
        self.writer.add_scalar("grad_norm", norm, self.ctx.i)
        self.losses.append(value)
        self.norms.append(norm)
        if not math.isfinite(value) and self.nan_at is None:
            self.nan_at = self.ctx.i  # TerminateOnNaN would stop here


def jumps(series: list[float], start: int = 0) -> list[int]:
    """The steps at or after ``start`` where the curve shows something (rule above)."""
    out = []
    for t in range(max(start, 0), len(series)):
        v = series[t]
        past = [x for x in series[max(0, t - 20):t] if math.isfinite(x)]
        if not math.isfinite(v) or (len(past) >= 5 and v > 10 * float(np.median(past))):
            out.append(t)
    return out


def visible(series: list[float], start: int) -> int | None:
    """The first step at or after ``start`` where the curve shows the bug."""
    seen = jumps(series, start)
    return seen[0] if seen else None


def _verdict(case: Case, planted: int | None, fired: int | None) -> str:
    at = case.plant_at if planted is None else planted
    if fired is None:
        return "no"
    if at - 1 <= fired <= at + 1 + case.grace:
        return f"yes ({fired})"
    return f"{'early' if fired < at - 1 else 'late'} ({fired})"


def run_baselines(cases: list[Case], *, steps: int | None = None, rows: list[Judged] | None = None,
                  progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """One row per plain-loop bug: each baseline's verdict, and the watch's (from ``rows``)."""
    watch = {j.case.name: j for j in rows or [] if j.variant == "default"}
    out = []
    for case in cases:
        if case.healthy or not case.baselines:
            continue
        row: dict[str, Any] = {"case": case.name, "model": case.model, "planted": case.plant_at}
        j = watch.get(case.name)
        row["watch"] = "-" if j is None else (
            (f"yes ({j.step})" + ("" if j.module_right else ", wrong module")) if j.status == "caught"
            and j.within_one else f"late ({j.step})" if j.status == "caught" else j.status)
        for kind in (Anomaly, Underflow, Scalars):
            judged, ctx = run_case(case, steps=steps, monitor=kind)
            base = next((r for r in ctx.results if isinstance(r, Baseline)), None)
            planted = ctx.planted
            row["planted"] = case.plant_at if planted is None else planted
            if judged.status == "crash" or base is None:
                verdict = f"crash: {judged.error}" if judged.status == "crash" else "crash: no monitor"
                names = ["TerminateOnNaN", "TensorBoard scalars"] if kind is Scalars else [kind.name]
                for n in names:
                    row[n] = verdict
                continue
            if isinstance(base, Scalars):
                row["TerminateOnNaN"] = _verdict(case, planted, base.nan_at)
                start = row["planted"] - 1
                seen = [t for t in (visible(base.losses, start), visible(base.norms, start)) if t is not None]
                row["TensorBoard scalars"] = _verdict(case, planted, min(seen) if seen else None)
            else:
                row[kind.name] = _verdict(case, planted, base.fired)
        if progress is not None:
            progress(f"baselines {case.name:30} " + " | ".join(f"{k}: {v}" for k, v in row.items()
                                                               if k not in ("case", "model")))
        out.append(row)
    return out


def healthy_scalars(cases: list[Case], *, steps: int | None = None) -> list[dict[str, Any]]:
    """The scalar rules on the healthy plain loops: how often a correct run would look alarming
    (``detect_anomaly`` and ``DebugUnderflowOverflow`` raise only on NaN/Inf; not run here)."""
    out = []
    for case in cases:
        if not case.healthy or not case.baselines:
            continue
        judged, ctx = run_case(case, steps=steps, monitor=Scalars)
        base = next((r for r in ctx.results if isinstance(r, Scalars)), None)
        if judged.status == "crash" or base is None:
            out.append({"case": case.name, "TerminateOnNaN": f"crash: {judged.error}",
                        "TensorBoard scalars": ""})
            continue
        seen = sorted(set(jumps(base.losses) + jumps(base.norms)))
        listed = f": {', '.join(map(str, seen[:6]))}{', ...' if len(seen) > 6 else ''}" if seen else ""
        out.append({"case": case.name, "TerminateOnNaN": "stops" if base.nan_at is not None else "silent",
                    "TensorBoard scalars": f"{len(seen)} step(s) look alarming{listed}"})
    return out


__all__ = ["healthy_scalars", "jumps", "run_baselines", "visible", "one_line"]
