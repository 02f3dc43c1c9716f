"""``python -m inspector compare A B``: what changed between two models, checkpoints or run files."""

from __future__ import annotations

import argparse
from typing import Any

from ..comparison import DEFAULT_TOLERANCE, RunComparison, WeightComparison, compare, shown_step_columns
from . import argtypes as types
from .common import (
    add_fail_on,
    default_device,
    failing_status,
    print_findings,
    print_table,
    progress,
    say,
    strict_json,
    write_json,
)

MAX_ROWS = 60  # tensors (or steps) printed without --all or --max-rows
MAX_MODULES = 20  # modules that changed most, printed without --all or --max-rows

HELP = ("compare two models or checkpoints (sample:, FILE.py:factory, hf:, .safetensors/.pt/.bin, "
        "torch.distributed.checkpoint folders) tensor by tensor, or two run files step by step")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", help="A: a source (sample:NAME, FILE.py:factory, hf:DIR), a checkpoint file or "
                                  "folder, or a run file")
    parser.add_argument("b", help="B: the same kinds as A")
    parser.add_argument(
        "--device",
        default=None,
        type=types.device,
        help="where models built from sources go (default: cpu; meta for structure-only samples, "
        "whose names, shapes and dtypes are then compared without values)",
    )
    parser.add_argument("--tolerance", default=DEFAULT_TOLERANCE, type=types.tolerance,
                        help="run files: relative difference of any recorded number (loss, gradient norms, "
                        "learning rates...) beyond which the runs diverge; 0 for any "
                        f"(default {DEFAULT_TOLERANCE:g})")
    parser.add_argument("--expect-unchanged", action="append", default=[], metavar="PATTERN",
                        help="glob pattern of tensor names or module prefixes meant to stay unchanged "
                        "('*.wte', 'model.layers.*.mlp'): reported as info, not as a warning (repeatable)")
    add_fail_on(parser)
    parser.add_argument("--all", action="store_true",
                        help="list every tensor, not only those that differ, and every changed module: "
                        "every row of both tables (unless --max-rows is given)")
    parser.add_argument("--max-rows", type=types.positive_int, default=None, metavar="N",
                        help=f"rows of each table to print (default {MAX_ROWS} tensors and {MAX_MODULES} "
                        "modules; with --all, every row); a line says how many more there are")
    parser.add_argument("--json", default=None, type=types.output_file, metavar="PATH",
                        help="write the tables and findings as JSON")


def run(args: argparse.Namespace) -> int:
    progress(f"comparing {args.a} with {args.b}")
    device = args.device or ("meta" if "meta" in (default_device(args.a), default_device(args.b)) else "cpu")
    result = compare(args.a, args.b, device=device, tolerance=args.tolerance, progress=progress,
                     expect_unchanged=args.expect_unchanged)
    if isinstance(result, RunComparison):
        _print_runs(result, args)
    else:
        _print_weights(result, args)
    print_findings(list(result.findings))
    if args.json:
        write_json(args.json, to_json(result), strict=True)
    return failing_status(result.findings, args.fail_on)


def _print_weights(result: WeightComparison, args: argparse.Namespace) -> None:
    f = result.facts
    say(f"A: {result.a} ({result.a_kind}), B: {result.b} ({result.b_kind})")
    say(f"{f['summary']}; {f['missing']} only in A, {f['extra']} only in B, {f['renamed']} renamed")
    shown = result.tensors if args.all else result.tensors[result.tensors["status"] != "equal"]
    columns = [
        "name",
        "name_b",
        "status",
        "shape_a",
        "shape_b",
        "dtype_a",
        "dtype_b",
        "max_abs",
        "rel_change",
        "update_rank",
    ]
    if len(shown):
        rows, more = _limit(args, MAX_ROWS)
        print_table(shown[columns], rows, more=more)
    top = result.modules[result.modules["changed"] > 0].sort_values("rel_change", ascending=False)
    if len(top):
        say("modules that changed most (‖B−A‖/‖A‖; empty where ‖A‖ = 0):")
        rows, more = _limit(args, MAX_MODULES)
        print_table(top[["module", "tensors", "changed", "rel_change", "max_abs"]], rows, more=more)


def _limit(args: argparse.Namespace, default: int) -> tuple[int | None, str]:
    """``(max_rows, the option that shows the rest)`` of one table: ``--max-rows N`` when given, every row
    with ``--all``, else ``default``."""
    if args.max_rows is not None:
        return args.max_rows, "--max-rows N"
    return (None, "") if args.all else (default, "--all or --max-rows N")


def _print_runs(result: RunComparison, args: argparse.Namespace) -> None:
    say(
        f"A: {result.a}, B: {result.b}: {result.facts['common_steps']} common steps, tolerance "
        f"{result.tolerance:g}"
    )
    if result.first_divergence is None:
        say("the runs agree at every common step")
    else:
        say(f"first divergence at step {result.first_divergence}: "
            f"{_some(result.first_quantities) or '(module numbers only)'}; modules first: "
            f"{_some(result.first_modules) or '(none)'}")
    rows, more = _limit(args, MAX_ROWS)
    columns, left_out = shown_step_columns(result)
    print_table(result.steps[columns], rows, more=more)
    if left_out > 0:
        say(f"({left_out:,} more compared numbers not shown as columns (learning rates, logged scalars): "
            "--json PATH writes every one)")


def _records(df: Any) -> list[dict[str, Any]]:
    """``df.to_dict(orient="records")`` in one conversion of the whole table (pandas' own goes column by
    column per row: minutes for the 300,001 columns of two runs of 100,000 learning rates)."""
    names = [str(c) for c in df.columns]
    return [dict(zip(names, row, strict=True)) for row in df.to_numpy(dtype=object).tolist()]


def _some(names: tuple[str, ...], shown: int = 10) -> str:
    """The first ``shown`` of ``names``, and how many more."""
    more = f" and {len(names) - shown:,} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def to_json(result: WeightComparison | RunComparison) -> dict[str, Any]:
    """The result as plain data (:data:`inspector.comparison.JSON_SCHEMA`): facts, findings and tables
    (lists of records). Strict JSON: a number that is not finite is the string ``"nan"``, ``"inf"``
    or ``"-inf"``, a missing one ``null``."""
    data: dict[str, Any] = {"a": result.a, "b": result.b, "facts": dict(result.facts),
            "findings": [x.to_dict() for x in result.findings]}
    if isinstance(result, WeightComparison):
        data["tensors"] = result.tensors.to_dict(orient="records")
        data["modules"] = result.modules.to_dict(orient="records")
        data["renamed"] = [list(p) for p in result.renamed]
    else:
        data["steps"] = _records(result.steps)
        data["modules"] = result.modules.astype(object).to_dict(orient="records")
        data["first_divergence"] = result.first_divergence
        data["first_modules"] = list(result.first_modules)
        data["first_quantities"] = list(result.first_quantities)
    return strict_json(data)

