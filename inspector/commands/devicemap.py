"""``python -m inspector devicemap SOURCE --max-memory 0=20GiB,cpu=200GiB [--compare-accelerate]``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from .. import (
    InspectorError,
    compare_with_accelerate,
    format_bytes,
    parse_max_memory,
    plan_device_map_explained,
)
from ..placement import audit, device_usage, load_device_map
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

HELP = ("plan a device map that places every parameter and buffer for a memory budget, audit it "
        "(or a map from a JSON file), and compare with accelerate's infer_auto_device_map")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--max-memory", required=False, default=None, metavar="BUDGET",
                        help="bytes per device, e.g. 0=20GiB,1=20GiB,cpu=200GiB (GPUs by index, mps, "
                             "cpu, disk); devices need not exist on this machine")
    parser.add_argument("--no-split", default=None, metavar="CLASSES",
                        help="comma-separated module classes never to split (default: the model's "
                             "_no_split_modules)")
    parser.add_argument("--compare-accelerate", action="store_true",
                        help="also run accelerate's infer_auto_device_map and audit both side by side")
    parser.add_argument("--audit", default=None, metavar="MAP.json", type=types.input_file,
                        help="audit this JSON device map instead of planning one")
    parser.add_argument(
        "--json", default=None, metavar="OUT", type=types.output_file, help="write the result as JSON"
    )


def _usage_table(usage):
    table = usage.copy()
    for col in ("parameter_bytes", "buffer_bytes", "total_bytes", "budget_bytes", "reserved_bytes"):
        table[col] = table[col].map(lambda v: "" if v is None or v != v else format_bytes(v))
    return table


def _run_audit(args: argparse.Namespace, loaded) -> int:
    path = Path(args.audit)
    if not path.is_file():
        raise InspectorError(f"device map file {path} does not exist")
    dm = load_device_map(path.read_text(encoding="utf-8"), source=str(path))
    result = audit(loaded.model, dm)
    budget = parse_max_memory(args.max_memory) if args.max_memory else None
    usage = device_usage(result.table, budget)
    say(f"audit of {path} for {loaded.name}: {len(dm)} keys")
    print_table(_usage_table(usage))
    print_findings(result.findings)
    if args.json:
        write_json(args.json, {"model": loaded.source, "device_map": dm,
                               "findings": [f.to_dict() for f in result.findings],
                               "usage": usage.to_dict(orient="records"),
                               "tensors": result.table.to_dict(orient="records")})
    return 1 if any(f.severity == "error" for f in result.findings) else 0


def run(args: argparse.Namespace) -> int:
    loaded = load_from_args(args)
    if args.audit:
        return _run_audit(args, loaded)
    if not args.max_memory:
        raise InspectorError("give a budget with --max-memory, e.g. 0=20GiB,1=20GiB,cpu=200GiB, or a map "
                             "to check with --audit MAP.json")
    no_split = [c.strip() for c in args.no_split.split(",") if c.strip()] if args.no_split else None
    progress(f"planning {loaded.name} for {args.max_memory}")
    if args.compare_accelerate:
        logging.getLogger("accelerate").setLevel(logging.ERROR)  # "Device 0 is not available" noise
        comparison = compare_with_accelerate(loaded.model, args.max_memory, no_split)
        plan = comparison.ours
    else:
        comparison = None
        plan = plan_device_map_explained(loaded.model, args.max_memory, no_split)
    say(f"device map for {loaded.name} ({len(plan.device_map)} keys):")
    for key, dev in plan.device_map.items():
        say(f"  {key or '(whole model)'}: {dev!r}")
    print_table(_usage_table(plan.usage))
    print_findings(plan.findings)
    if comparison is not None and comparison.accelerate_error is not None:
        say(
            "\naccelerate could not plan this model: infer_auto_device_map raised "
            f"{comparison.accelerate_error}; "
            "the map above is ours alone"
        )
    elif comparison is not None:
        say(f"\naccelerate.infer_auto_device_map ({len(comparison.accelerate_map)} keys, "
              f"{comparison.accelerate_seconds * 1000:.1f} ms; ours {comparison.our_seconds * 1000:.1f} ms)")
        say(f"check_device_map on ours: {comparison.our_check or 'ok'}")
        say(f"check_device_map on accelerate's: {comparison.accelerate_check or 'ok'}")
        if len(comparison.difference):
            say("tensors where the maps differ:")
            print_table(comparison.difference)
        else:
            say("the two maps place every tensor alike")
        say("accelerate's map:")
        print_findings(comparison.accelerate_findings)
    if args.json:
        data = {"model": loaded.source, "max_memory": {str(k): v for k, v in plan.budget.items()},
                "device_map": plan.device_map, "records": [r.to_dict() for r in plan.records],
                "findings": [f.to_dict() for f in plan.findings],
                "usage": plan.usage.to_dict(orient="records")}
        if comparison is not None:
            data["accelerate"] = {
                "device_map": comparison.accelerate_map, "check_device_map": comparison.accelerate_check,
                "error": comparison.accelerate_error,
                "findings": [f.to_dict() for f in comparison.accelerate_findings],
                "difference": comparison.difference.to_dict(orient="records")}
        write_json(args.json, data)
    return 0
