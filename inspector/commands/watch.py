"""``python -m inspector watch FILE.py:factory --steps N [-o run.inspect]``: train with the watch on."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..distributed import SHARD_MODES, sharded
from ..report import verdict_line
from ..watching import OPTIMIZERS, StepFinding, train_watched
from . import argtypes as types
from .common import add_fail_on, failing_status, progress, say, training_ranks

HELP = (
    "train a model file's loop for N steps with the watch on: norms, learning rates and memory of every "
    "step into an Arrow run file, findings (NaN producers, dead or exploding gradients, ...) as they appear"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="path/to/file.py:factory (the file defines example_inputs and loss) "
                                       "or sample:<name>")
    parser.add_argument("--steps", type=types.positive_int, default=20, help="training steps (default 20)")
    parser.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="adamw", help="default adamw")
    parser.add_argument("--lr", type=types.positive_float, default=1e-3, help="learning rate (default 0.001)")
    parser.add_argument("--batch-size", type=types.positive_int, default=2, help="batch size (default 2)")
    parser.add_argument("--every", type=types.positive_int, default=1,
                        help="parameter norms, ties and optimizer membership every Nth step (default 1)")
    parser.add_argument("--nonfinite", action="store_true",
                        help="name the module that first produced NaN/Inf, forward and backward (costs more)")
    parser.add_argument("--update-ratio", action="store_true",
                        help="record each module's update-to-weight ratio (keeps a copy of the weights)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the last steps so that one that broke can be replayed (`replay --step N`)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--shard", choices=SHARD_MODES, default="none",
                        help="fsdp, ddp or none (default): across torchrun's ranks, else a world of one")
    add_fail_on(parser)
    parser.add_argument("-o", "--output", default="run.inspect", type=types.output_file,
                        help="the run file rank 0 writes (replaced; default run.inspect)")


def _print(f: StepFinding) -> None:
    say(f.line())


def run(args: argparse.Namespace) -> int:
    torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1
    group = torchrun or args.shard != "none"  # one process, not sharded: no process group at all
    with training_ranks(args.source, args.device, group=group) as (rank, world, device, loaded):
        out = Path(args.output)
        if rank == 0:
            progress(
                f"{loaded.name}: {args.steps} steps, {args.optimizer} lr {args.lr}, {world} rank(s) -> {out}"
            )
        with sharded(loaded.model, args.shard, device) as model:
            result = train_watched(
                model,
                loaded.example_inputs,
                loaded.loss,
                args.steps,
                out,
                optimizer=args.optimizer,
                lr=args.lr,
                batch_size=args.batch_size,
                device=device,
                every=args.every,
                nonfinite=args.nonfinite,
                update_ratio=args.update_ratio,
                keep=args.keep,
                name=loaded.name,
                note=loaded.source,
                on_finding=_print if rank == 0 else None,
            )
    errors = sum(f.severity == "error" for f in result.findings)
    if rank == 0:
        say(verdict_line(result.findings))
        say(f"{result.steps} steps watched; {len(result.findings)} findings ({errors} errors); wrote {out}")
    return failing_status([f.finding for f in result.findings], args.fail_on, quiet=rank != 0)
