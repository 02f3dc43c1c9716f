"""``python -m inspector offsets SOURCE [--trainable-only] [--backward] [--locate INDEX]``."""

from __future__ import annotations

import argparse

from .. import gradient_report, locate, offset_findings, offset_map, run_backward
from ..offsets import display_table
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

HELP = ("where each parameter sits in parameters_to_vector order, which tensor a flat index falls in, "
        "and gradient norms per parameter and per module")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--trainable-only", action="store_true",
                        help="offsets of a vector of the parameters with requires_grad only")
    parser.add_argument("--buffers", action="store_true",
                        help="list buffers after the parameters (they never shift a parameter)")
    parser.add_argument("--backward", action="store_true",
                        help="run one backward pass on the example inputs first (sets .grad), "
                             "then print gradient norms")
    parser.add_argument(
        "--locate",
        type=types.non_negative_int,
        action="append",
        default=None,
        metavar="INDEX",
        help="say which parameter and element flat index INDEX falls in (repeatable)",
    )
    parser.add_argument("--top", type=types.rows, default=15, metavar="K",
                        help="layers to list by gradient norm (default 15)")
    parser.add_argument("--max-rows", type=types.rows, default=60, help="rows of the offset table to print")
    parser.add_argument(
        "--json", default=None, metavar="PATH", type=types.output_file, help="write the tables as JSON"
    )


def run(args: argparse.Namespace) -> int:
    loaded = load_from_args(args)
    model = loaded.model
    with loaded.lock:
        table = offset_map(model, trainable_only=args.trainable_only, include_buffers=args.buffers)
        findings = offset_findings(model, trainable_only=args.trainable_only)
    params = table[table["kind"] == "parameter"]
    total = int(params["end"].iloc[-1]) if len(params) else 0
    vector = "trainable-only vector" if args.trainable_only else "parameters_to_vector(model.parameters())"
    say(f"model: {loaded.name} ({loaded.source}) on {loaded.device}")
    say(f"{vector}: {len(params)} tensors, {total:,} elements")
    print_table(display_table(table), args.max_rows, more="--max-rows N")
    for index in args.locate or []:
        say(locate(table, index).describe())
    out: dict = {"model": loaded.name, "source": loaded.source, "trainable_only": args.trainable_only,
                 "offsets": display_table(table).to_dict(orient="records")}
    if args.backward:
        progress("running a backward pass on the example inputs (this sets .grad)")
        result = run_backward(loaded)
        say(result.message)
    if args.backward or any(p.grad is not None for p in model.parameters()):
        with loaded.lock:
            report = gradient_report(model)
        counts = ", ".join(f"{n} {s}" for s, n in report.counts.items())
        say(f"gradient norm of the whole model: {report.total_norm:.6g}; parameters: {counts}")
        layers = report.by_module[report.by_module["owns_parameters"]]
        layers = layers.sort_values("own_norm", ascending=False, na_position="last")
        say(f"layers by the gradient norm of their own parameters (top {args.top} of {len(layers)}):")
        print_table(layers[["name", "own_norm", "norm", "state", "nan", "inf", "numel"]].head(args.top))
        bad = report.by_parameter[report.by_parameter["state"] != "ok"]
        if len(bad):
            say("parameters without a usable gradient:")
            print_table(bad[["name", "state", "norm", "nan", "inf", "numel"]], args.max_rows,
                        more="--max-rows N")
        findings += report.findings
        out["gradient_norms"] = report.by_parameter.to_dict(orient="records")
        out["module_norms"] = report.by_module.to_dict(orient="records")
    else:
        say("gradients: none yet (add --backward to run one backward pass on the example inputs)")
    print_findings(loaded.findings + findings)
    if args.json:
        out["findings"] = [f.to_dict() for f in findings]
        write_json(args.json, out)
    return 0
