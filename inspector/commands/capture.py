"""``python -m inspector capture SOURCE --modules PATTERN [--json OUT]``."""

from __future__ import annotations

import argparse

import torch

from .. import capture_activations, format_bytes
from . import argtypes as types
from .common import (
    add_source_arguments,
    load_from_args,
    print_findings,
    print_table,
    progress,
    say,
    write_json,
)

HELP = "capture module outputs as detached copies: statistics, and outputs overwritten in place"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--modules", action="append", default=None, metavar="PATTERN",
                        help="module name, glob pattern (e.g. 'transformer.h.*.mlp') or class name "
                             "(e.g. ReLU); repeat for more; default: every module")
    parser.add_argument(
        "--batch-size", type=types.batch_size, default=2, help="example inputs batch size (default 2)"
    )
    parser.add_argument(
        "--store-on", default="cpu", type=types.device, help="where the copies go (default cpu)"
    )
    parser.add_argument(
        "--max-bytes", type=types.non_negative_int, default=None, help="byte budget for the copies"
    )
    parser.add_argument("--grad-mode", choices=["inference", "no_grad", "grad"], default="no_grad",
                        help="autograd mode of the forward pass (default no_grad)")
    parser.add_argument("--grads", action="store_true", help="also capture output gradients (backward)")
    parser.add_argument("--inputs", action="store_true", help="also capture module inputs")
    parser.add_argument("--no-mutation-watch", dest="watch_mutations", action="store_false",
                        help="do not watch for in-place writes (faster on very deep models; "
                             "mutations are then not checked)")
    parser.add_argument("--max-rows", type=types.rows, default=200, metavar="N",
                        help="rows of the stats table to print (default 200; a line says how many more)")
    parser.add_argument(
        "--json",
        default=None,
        metavar="OUT",
        type=types.output_file,
        help="write stats, mutations and skips as JSON",
    )


def run(args: argparse.Namespace) -> int:
    loaded = load_from_args(args)
    loaded.check_runnable()
    inputs = loaded.example_inputs(args.batch_size)
    mode = {"inference": torch.inference_mode, "no_grad": torch.no_grad, "grad": torch.enable_grad}[
        "grad" if args.grads else args.grad_mode]
    progress(f"capturing {', '.join(args.modules) if args.modules else 'every module'}")
    with mode():
        caps = capture_activations(loaded.model, inputs, modules=args.modules, store_on=args.store_on,
                                   max_bytes=args.max_bytes, grads=args.grads, keep_inputs=args.inputs,
                                   watch_mutations=args.watch_mutations,
                                   loss_fn=loaded.loss if args.grads and loaded.has_loss else None)
    say(f"model: {loaded.name} ({loaded.source}) on {loaded.device}")
    say(f"captured: {len(caps.outputs)} outputs, {format_bytes(caps.total_bytes)} on {caps.store_on}")
    print_table(caps.stats.drop(columns=["device"]), args.max_rows, more="--max-rows N")
    if caps.mutated:
        say(f"mutated after capture ({len(caps.mutated)}): a bare reference to these outputs is wrong")
        for m in caps.mutations:
            say(f"  {m.module}{m.path}: overwritten by {m.by or 'code outside any module'} "
                  f"(seen by {m.how}, largest change {m.max_abs_change:.4g})")
    elif not caps.mutations_watched:
        say("mutated after capture: not checked (--no-mutation-watch)")
    else:
        say("mutated after capture: none")
    if caps.skipped:
        say(f"skipped ({len(caps.skipped)}):")
        print_table(caps.skipped_table)
    print_findings(loaded.findings + caps.findings)
    if args.json:
        write_json(args.json, {"model": loaded.name, "source": loaded.source, **caps.to_dict()})
    return 0
