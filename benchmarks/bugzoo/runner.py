"""One runner for every zoo case: run it under the watch (or a baseline), collect what was
found, judge it against the plant. A case that raises anything but its planted error is a crash,
reported with its one-line message; the zoo goes on."""

from __future__ import annotations

import fnmatch
import os
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch

from inspector import read_run

from . import cases_plain, cases_recipes, cases_stacks
from .core import AFTER, HEALTHY_STEPS, Case, Ctx, Judged, PlantedError, judge

HEALTHY: list[Case] = cases_plain.HEALTHY + cases_stacks.HEALTHY + cases_recipes.HEALTHY
BUGS: list[Case] = cases_plain.BUGS + cases_stacks.BUGS + cases_recipes.BUGS


def select(pattern: str | None = None, cases: Iterable[Case] | None = None) -> list[Case]:
    """The cases whose name matches any of the comma-separated glob patterns (a bare word matches
    as a substring)."""
    pool = list(cases) if cases is not None else HEALTHY + BUGS
    if not pattern:
        return pool
    pats = [p if any(c in p for c in "*?[") else f"*{p}*" for p in pattern.split(",")]
    return [c for c in pool if any(fnmatch.fnmatch(c.name, p) for p in pats)]


def steps_for(case: Case, steps: int | None) -> int:
    """Healthy cases run ``steps`` (200); a bug runs to ``AFTER`` steps past its plant."""
    if case.healthy:
        return steps or HEALTHY_STEPS
    return case.plant_at + AFTER if steps is None else min(steps, case.plant_at + AFTER)


def _findings(ctx: Ctx) -> list[Any]:
    """Every finding the run gave: each watch's result (the object the case left in ``ctx.results``)
    and the run file read back, without duplicates."""
    found: dict[tuple[int, str, str], Any] = {}
    for r in ctx.results:
        result = getattr(r, "result", None)
        for f in getattr(result, "findings", None) or getattr(r, "findings", None) or []:
            found.setdefault((f.step, f.code, f.where), f)
    if os.path.exists(ctx.path):
        try:
            for f in read_run(ctx.path).findings:
                found.setdefault((f.step, f.code, f.where), f)
        except Exception:  # noqa: BLE001 - a run file that cannot be read holds no findings to add
            pass
    return sorted(found.values(), key=lambda f: (f.step, f.code))


def one_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:160]


def run_case(case: Case, *, nonfinite: bool = False, steps: int | None = None,
             monitor: Callable[..., Any] | None = None, folder: str | None = None) -> tuple[Judged, Ctx]:
    """Run one case (default watch options, or ``nonfinite=True``) and judge it."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    variant = "nonfinite" if nonfinite else "default"
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        ctx = Ctx(os.path.join(tmp, f"{case.name}.inspect"), steps_for(case, steps), case.plant_at,
                  {"nonfinite": True} if nonfinite else {}, monitor)
        start = time.perf_counter()
        error = ""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                case.run(ctx)
        except PlantedError:
            pass
        except Exception as e:  # noqa: BLE001 - every failure of a case is reported as a crash
            error = one_line(e)
            if os.environ.get("BUGZOO_TRACE"):
                traceback.print_exc()
        seconds = time.perf_counter() - start
        findings = _findings(ctx)
    if not error and not case.healthy and ctx.planted is None and case.plant_at > 0:
        error = f"the bug was never planted: the run ended at iteration {ctx.i} before step {case.plant_at}"
    if error:
        judged = Judged(case, variant, "crash", error=error, findings=findings)
    else:
        judged = judge(case, variant, findings, ctx.planted)
    judged.seconds = seconds
    return judged, ctx


def run_zoo(cases: list[Case], *, steps: int | None = None, nonfinite: bool = True,
            healthy_nonfinite: bool = False,
            progress: Callable[[Judged], None] | None = None) -> list[Judged]:
    """Every case with default options; the bugs that name ``expect_nonfinite`` again with
    ``nonfinite=True`` (and, with ``healthy_nonfinite``, every healthy case)."""
    rows = []
    for case in cases:
        again = case.expect_nonfinite if not case.healthy else healthy_nonfinite
        variants = [False] + ([True] if nonfinite and again else [])
        for nf in variants:
            judged, _ = run_case(case, nonfinite=nf, steps=steps)
            rows.append(judged)
            if progress is not None:
                progress(judged)
    return rows
