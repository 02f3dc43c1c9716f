"""``python -m benchmarks.bugzoo.replays [--only PATTERN] [--markdown FILE]``: the zoo's NaN/Inf and
exploding cases trained with ``keep=True``, and the step the watch kept replayed on the live model:
whether the loss came back bit for bit, and which op (module, file:line) made the first NaN/Inf."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from inspector import InspectorError, replay

from .cases_plain import log_zero
from .core import Case, Ctx, PlantedError, WatchMonitor
from .models import MODELS, VOCAB
from .runner import one_line, select, steps_for

CASES = (
    "llama-inf-weight",
    "cnn-div-zero-conv2",
    "gpt2-div-zero-mlp",
    "mlp-nan-batch",
    "vit-nan-batch",
    "mlp-backward-nan",
    "mlp-loss-log0",
    "mlp-huge-lr",
    "cnn-huge-lr",
    "lstm-exploding-head",
    "gpt2-exploding-block",
)


def keeping(ctx: Ctx, model: nn.Module, optimizer: Any, **extra: Any) -> WatchMonitor:
    return WatchMonitor(ctx, model, optimizer, keep=True, **extra)


def loss_for(model: str) -> Callable[[Any, Any], torch.Tensor] | None:
    """The zoo loop's loss as ``loss(outputs, inputs)``: a Hugging Face model's is ``outputs.loss``; the
    others'
    targets are not among the model's inputs, so they are found again among the task's fixed batches."""
    if model not in ("mlp", "cnn", "lstm"):
        return None
    task = MODELS[model](0)
    batches = [task.batch(i) for i in range(16)]

    def batch_of(x: torch.Tensor) -> dict[str, torch.Tensor]:
        for b in batches:
            seen = b["ids"][:, :-1] if model == "lstm" else b["x"]
            if seen.shape == x.shape and torch.equal(seen[1:], x[1:]):  # row 0 may hold a planted NaN
                return b
        raise InspectorError("the replayed batch is none of the task's batches")

    if model == "lstm":
        return lambda out, ids: nn.functional.cross_entropy(
            out.reshape(-1, VOCAB), batch_of(ids)["ids"][:, 1:].reshape(-1)
        )
    return lambda out, x: nn.functional.cross_entropy(out, batch_of(x)["y"])


LOOP_LOSSES = {"mlp-loss-log0": log_zero}  # cases whose loop changes the loss at the planted step


def loss_at(case: Case, step: int, planted: int | None) -> Callable[[Any, Any], torch.Tensor] | None:
    """The loss the zoo loop computed at ``step`` of ``case``: the task's (:func:`loss_for`), and at the
    planted step the plant's change to it where the case plants one in the loss."""
    base, plant = loss_for(case.model), LOOP_LOSSES.get(case.name)
    if base is None or plant is None or step != planted:
        return base
    return lambda out, x: plant(base(out, x))


@dataclass
class Row:
    case: str
    planted: int | None
    step: int | None = None
    reproduced: bool | None = None
    culprit: str = ""
    module: str = ""
    source: str = ""
    error: str = ""

    def cells(self) -> list[str]:
        rep = {True: "yes", False: "no", None: "-"}[self.reproduced]
        return [
            self.case,
            str(self.planted),
            "-" if self.step is None else str(self.step),
            rep,
            f"`{self.culprit}`" if self.culprit else "-",
            self.module or "-",
            self.source or "-",
            self.error or "",
        ]


def replay_case(case: Case, steps: int | None = None) -> Row:
    """Train ``case`` with ``keep=True``, then replay the first step a replay file holds."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Ctx(os.path.join(tmp, "run.inspect"), steps_for(case, steps), case.plant_at, {}, keeping)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                case.run(ctx)
        except PlantedError:
            pass
        except Exception as e:  # noqa: BLE001 - reported in the row
            return Row(case.name, ctx.planted, error=f"training crashed: {one_line(e)}")
        w = ctx.results[0]
        row = Row(case.name, ctx.planted)
        if not w.keeper.written:
            row.error = "; ".join(w.keeper.notes) or "no replay file written"
            return row
        from inspector.replaying import ReplayFile

        row.step = ReplayFile(w.keeper.written[0]).meta.step
        try:
            r = replay(ctx.path, row.step, model=w.model, loss=loss_at(case, row.step, ctx.planted))
        except Exception as e:  # noqa: BLE001 - reported in the row
            row.error = f"replay failed: {one_line(e)}"
            return row
        row.reproduced = r.reproduced
        if r.batch_nonfinite:
            row.culprit, row.module = "(batch)", ", ".join(r.batch_nonfinite)
        elif r.weights_nonfinite:
            row.culprit, row.module = "(weights)", ", ".join(r.weights_nonfinite[:2])
        elif r.first is not None:
            row.culprit, row.module = f"{r.first.phase} {r.first.op}", r.first.module
            row.source = (
                f"{os.path.relpath(r.first.source.rpartition(':')[0])}:{r.first.source.rpartition(':')[2]}"
            )
        elif not r.ops:
            row.error = "no NaN/Inf in the replayed step" + (
                f" (loss {r.loss:.4g})" if r.loss is not None else ""
            )
        return row


def healthy_copies(case: Case, steps: int | None = None) -> tuple[int, int, int]:
    """A healthy case trained with ``keep=True``: its steps, the steps whose weights were copied, the replay
    files written (each a copy on a healthy step: the target is none)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        ctx = Ctx(os.path.join(tmp, "run.inspect"), steps_for(case, steps), case.plant_at, {}, keeping)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            case.run(ctx)
        w = ctx.results[0]
        return w.steps, w.keeper.copies, len(w.keeper.written)


HEADER = ["case", "planted", "replayed", "reproduced", "first NaN/Inf", "module / tensors", "line", "note"]


def table(rows: list[Row]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r.cells()) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bugzoo.replays", description=__doc__)
    parser.add_argument("--only", help="comma-separated case-name patterns")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table to FILE")
    parser.add_argument("--healthy", action="store_true",
                        help="instead: the healthy cases with keep=True, the steps whose weights were copied")
    parser.add_argument("--steps", type=int, default=None,
                        help="cap the healthy cases at N steps (default 200)")
    args = parser.parse_args(argv)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
    except ImportError:  # pragma: no cover
        pass
    if args.healthy:
        print("| case | steps | weights copied | replay files |\n|---|---|---|---|")
        for case in select(args.only):
            if case.healthy and case.stack == "torch" and case.baselines:
                counts = healthy_copies(case, args.steps)
                print(f"| {case.name} | " + " | ".join(str(n) for n in counts) + " |", flush=True)
        return 0
    cases = [c for c in select(args.only) if c.name in CASES]
    rows = []
    for case in cases:
        rows.append(replay_case(case))
        print(" | ".join(rows[-1].cells()), file=sys.stderr, flush=True)
    text = table(rows)
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
