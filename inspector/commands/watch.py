"""``python -m inspector watch FILE.py:factory --steps N [-o run.inspect]``: train with the watch on.
Without ``-o`` it writes a new file (``run.inspect``, else ``run-1.inspect``...), never replacing one."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..distributed import SHARD_MODES, sharded
from ..report import verdict_line
from ..utils import InspectorError
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
    parser.add_argument("-o", "--output", default=None, type=types.output_file,
                        help="the run file rank 0 writes (replaced when given; default: run.inspect, or "
                             "run-1.inspect, run-2.inspect... when it exists: no file is replaced)")


MAX_NUMBERED = 10_000


def new_run_path(folder: Path, stem: str = "run", suffix: str = ".inspect") -> Path:
    """The first of ``run.inspect``, ``run-1.inspect``, ``run-2.inspect``... in ``folder`` that names
    nothing yet (not even a dangling link): what ``watch`` writes without ``-o``, so it never replaces a
    run file, its own or another command's.

    Raises:
        InspectorError: all of the first ``MAX_NUMBERED`` are taken.
    """
    for i in range(MAX_NUMBERED + 1):
        path = folder / (f"{stem}{suffix}" if i == 0 else f"{stem}-{i}{suffix}")
        if not os.path.lexists(path):
            return path
    raise InspectorError(f"{folder} already holds {stem}{suffix} and {stem}-1{suffix} to "
                         f"{stem}-{MAX_NUMBERED}{suffix}; give the run file with -o FILE")


def _print(f: StepFinding) -> None:
    say(f.line())


def run(args: argparse.Namespace) -> int:
    torchrun = int(os.environ.get("WORLD_SIZE", "1")) > 1
    group = torchrun or args.shard != "none"  # one process, not sharded: no process group at all
    # picked before the process group starts, so every rank picks the same name before rank 0 writes it
    out = Path(args.output) if args.output is not None else new_run_path(Path.cwd())
    with training_ranks(args.source, args.device, group=group) as (rank, world, device, loaded):
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
