"""``python -m inspector aliases SOURCE [--convert NAME]``."""

from __future__ import annotations

import argparse

from .. import CONVERSIONS, InspectorError, alias_analysis, conversion_table, format_bytes
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

HELP = "alias groups (tied, shared-storage, overlapping tensors) and the conversions that break them"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--convert", action="append", default=None, metavar="NAME",
                        help=f"run a conversion on a copy and report each tie: {', '.join(CONVERSIONS)} "
                             "or 'all' (repeatable)")
    parser.add_argument("--retie", action="store_true",
                        help="also re-tie the converted copy and show the result")
    parser.add_argument(
        "--json", default=None, metavar="PATH", type=types.output_file, help="write the results as JSON"
    )


def run(args: argparse.Namespace) -> int:
    names: list[str] = []
    for n in args.convert or []:
        if n == "all":
            names += [c for c in CONVERSIONS if c not in names]
        elif n not in CONVERSIONS:
            raise InspectorError(f"unknown conversion {n!r}; choose one of {', '.join(CONVERSIONS)} or all")
        elif n not in names:
            names.append(n)
    loaded = load_from_args(args)
    with loaded.lock:
        analysis = alias_analysis(loaded.model)
    say(f"model: {loaded.name} ({loaded.source}) on {loaded.device}")
    say(f"parameter elements: {analysis.unique_numel:,} unique, {analysis.numel_with_aliases:,} "
          f"counting aliases; {analysis.names:,} names")
    if analysis.groups:
        say(f"alias groups ({len(analysis.groups)}):")
        print_table(analysis.to_frame())  # every group
    else:
        say("alias groups: none")
    for d in analysis.disjoint:
        regions = " | ".join(", ".join(r) for r in d.regions)
        say(f"info: disjoint views of one storage ({format_bytes(d.storage_nbytes)}), not aliases: {regions}")
    findings = list(analysis.findings)
    results: list = []
    if names:
        progress(f"running {len(names)} conversion(s) on copies of the model")
        table, results = conversion_table(loaded.model, names, retie_after=args.retie)
        say("conversion check:")
        print_table(table.drop(columns=["error"]) if table["error"].isna().all() else table)
        for r in results:
            findings += [f for f in r.findings]
    print_findings(loaded.findings + findings)
    if args.json:
        write_json(args.json, {"model": loaded.name, "source": loaded.source, **analysis.to_dict(),
                               "conversions": [r.to_dict() for r in results]})
    return 0
