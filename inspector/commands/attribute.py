"""``python -m inspector attribute SOURCE --method ig --target N [--layer NAME]``."""

from __future__ import annotations

import argparse

from .. import METHODS, attribute
from ..figures import completeness_line
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

HELP = ("captum attributions of one output (a class, or the next token's logit) to the inputs or "
        "a layer: Integrated Gradients, Saliency, Input x Gradient, layer IG, conductance, GradCAM")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--method", default="ig", choices=list(METHODS),
                        help="attribution method (default: ig; on token ids it runs as layer_ig)")
    parser.add_argument(
        "--target",
        type=types.class_index,
        default=None,
        help="class index, or next-token id for language models (default: the model's predicted "
        "class or next token, which the output names)",
    )
    parser.add_argument("--layer", default=None,
                        help="module name for layer methods (default: the input embedding for layer_ig "
                             "on token models, the last convolution for layer_gradcam)")
    parser.add_argument("--position", type=types.position, default=-1,
                        help="sequence position attributed for (B, T, V) outputs (default: -1, the last)")
    parser.add_argument(
        "--steps", type=types.steps, default=None, help="n_steps of integrating methods (default 50)"
    )
    parser.add_argument(
        "--batch-size", type=types.batch_size, default=1, help="example inputs to attribute (default 1)"
    )
    parser.add_argument(
        "--rows", type=types.rows, default=40, help="summary rows to print, largest |score| first"
    )
    parser.add_argument(
        "--json", default=None, metavar="PATH", type=types.output_file, help="also write the result as JSON"
    )


def run(args: argparse.Namespace) -> int:
    loaded = load_from_args(args)
    loaded.check_runnable()
    options = {}
    if args.steps is not None:
        if not METHODS[args.method].has_delta:
            progress(f"--steps is ignored: {args.method} does not integrate")
        else:
            options["n_steps"] = args.steps
    progress(f"running {args.method} on {loaded.name}")
    result = attribute(loaded, loaded.example_inputs(args.batch_size), args.method, args.target,
                       args.layer, position=args.position, **options)
    say(f"model: {loaded.name} ({loaded.source}) on {loaded.device}")
    where = f"layer {result.layer}" if result.layer else "inputs"
    pos = f" at position {result.position}" if result.position is not None else ""
    chosen = " (predicted: no --target given)" if args.target is None and result.target is not None else ""
    say(f"method: {result.method} ({result.captum_method}) on {where}, target {result.target}{chosen}{pos}")
    table = result.summary.assign(order=result.summary["abs_score"].fillna(float("inf")))
    table = table.sort_values("order", ascending=False).drop(columns="order")
    say("summary, largest |score| first:")
    print_table(table, args.rows, more="--rows N")
    say(completeness_line(result))
    print_findings(loaded.findings + result.findings)
    if args.json:
        write_json(args.json, result.to_dict())
    return 0
