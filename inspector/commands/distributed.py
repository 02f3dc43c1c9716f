"""``torchrun --nproc-per-node N -m inspector distributed SOURCE --shard fsdp --steps K -o run.inspect``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..distributed import SHARD_MODES, sharded, train_and_check
from . import argtypes as types
from .common import print_findings, progress, say, training_ranks

HELP = (
    "under torchrun: shard the model on every rank, train a few steps and check each one "
    "(replica drift, nonfinite gradients by rank, imbalance, memory); rank 0 writes the run file"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="path/to/file.py:factory (the file defines example_inputs and loss) "
                                       "or sample:<name>")
    parser.add_argument("--shard", choices=SHARD_MODES, default="fsdp",
                        help="fsdp: fully_shard each block then the model (default); ddp; none")
    parser.add_argument("--steps", type=types.train_steps, default=3,
                        help="training steps to run and check (default 3)")
    parser.add_argument(
        "--batch-size", type=types.batch_size, default=2, help="batch size per rank (default 2)"
    )
    parser.add_argument(
        "--lr", type=types.positive_float, default=1e-2, help="SGD learning rate (default 0.01)"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (gloo) or cuda (NCCL, each rank on the GPU of its LOCAL_RANK)")
    parser.add_argument("-o", "--output", required=True, type=types.output_file,
                        help="the run file rank 0 writes (replaced; Arrow, as watch writes)")


def run(args: argparse.Namespace) -> int:
    with training_ranks(args.source, args.device) as (rank, world, device, loaded):
        out = Path(args.output)
        if rank == 0:
            progress(f"{loaded.name}: {args.shard} on {world} rank(s), {args.steps} steps -> {out}")
            out.unlink(missing_ok=True)
        with sharded(loaded.model, args.shard, device) as model:
            checks = train_and_check(model, loaded.example_inputs, loaded.loss, args.steps, str(out),
                                     batch_size=args.batch_size, lr=args.lr, device=device,
                                     note=f"{loaded.source} --shard {args.shard}")
    if rank == 0:
        for check in checks:
            g = check.record["global"]
            per_rank = ", ".join(f"{r['grad_norm']:.4g}" for r in check.record["ranks"]
                                 if r["grad_norm"] is not None)
            say(f"step {check.step}: grad norm {g['grad_norm']:.6g} (per rank: {per_rank}); "
                  f"{len(check.findings)} findings")
        print_findings(checks[-1].findings)
        progress(f"wrote {out}")
    return 1 if any(f.severity == "error" for c in checks for f in c.findings) else 0
