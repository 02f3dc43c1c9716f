"""``python -m inspector report SOURCE --format html|json|md|pdf -o FILE``."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

from .. import SECTIONS, InspectorError, build_report, format_bytes, read_run, run_report
from ..distributed import is_run_file
from ..report import check_options, check_sections
from ..utils import regular_file
from ..watching import is_watch_file
from . import argtypes as types
from .common import add_source_arguments, load_from_args, progress, write_text

HELP = ("write a report of every analysis (HTML, JSON, Markdown or PDF); SOURCE may also be the "
        "run file of a watched training run or of check_step (or the run.jsonl of an older version)")
FORMATS = {"html": ".html", "json": ".json", "md": ".md", "pdf": ".pdf"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--sections", nargs="+", default=None, metavar="SECTION",
                        help=f"sections to include (default: all; findings always): {', '.join(SECTIONS)}")
    parser.add_argument("--format", choices=list(FORMATS), default=None,
                        help="output format (default: from the -o file's extension, else html)")
    parser.add_argument("-o", "--output", required=True, type=types.output_file, help="file to write")
    parser.add_argument(
        "--batch-size", type=types.batch_size, default=None, help="batch size of the example inputs"
    )
    parser.add_argument("--backward", action="store_true",
                        help="run one backward pass for gradient norms (earlier .grad values are put back)")
    parser.add_argument("--max-memory", default=None, metavar="BUDGET",
                        help="device budget for the device-map plan, e.g. 0=20GiB,1=20GiB,cpu=64GiB")
    parser.add_argument("--conversions", nargs="+", default=None, metavar="NAME",
                        help="conversion checks to run: names, 'all' or 'none' "
                             "(default: all of them on models up to 64 MiB)")
    parser.add_argument("--compare-with", default=None, metavar="B",
                        help="compare section: a source, checkpoint file or folder to compare the model with")
    parser.add_argument("--attribution-method", default=None, help="ig, saliency, layer_ig, ...")
    parser.add_argument("--attribution-target", type=types.class_index, default=None,
                        help="class index or next-token id to attribute (default 0)")
    parser.add_argument("--attribution-steps", type=types.steps, default=None,
                        help="n_steps of integrating attribution methods (default: captum's 50)")
    parser.add_argument("--attribute-on-cpu", action="store_true",
                        help="attribute models over 64 MiB on the CPU too (slow: ~50 passes of the model)")


def output_format(args: argparse.Namespace) -> str:
    if args.format:
        return args.format
    suffix = Path(args.output).suffix.lower()
    for name, ext in FORMATS.items():
        if suffix == ext or (name == "md" and suffix == ".markdown"):
            return name
    return "html"


def options_from_args(args: argparse.Namespace) -> dict:
    options: dict = {}
    if args.batch_size is not None:
        if args.batch_size < 1:
            raise InspectorError(f"--batch-size must be at least 1, got {args.batch_size}")
        options["batch_size"] = args.batch_size
    if args.backward:
        options["backward"] = True
    if args.max_memory:
        options["max_memory"] = args.max_memory
    if args.conversions:
        names = [n for part in args.conversions for n in part.split(",") if n]
        options["conversions"] = [] if names == ["none"] else "all" if names == ["all"] else names
    for key in ("attribution_method", "attribution_target", "attribution_steps"):
        if getattr(args, key) is not None:
            options[key] = getattr(args, key)
    if args.attribute_on_cpu:
        options["attribution_cpu_max_bytes"] = None
    if args.compare_with:
        options["compare_with"] = args.compare_with
    options["controls"] = {"backward": "add --backward for one backward pass",
                           "conversions": "add --conversions all to run them",
                           "attribution_cpu_max_bytes": "add --attribute-on-cpu (and perhaps a small "
                                                        "--attribution-steps) to run it here",
                           "lab": "the dashboard's Labs page adds them",
                           "compare_with": "add --compare-with B (a source, checkpoint file or folder)"}
    check_options(options)
    return options


RUN_SUFFIXES = (".inspect", ".jsonl")  # what a path named so is taken for when it is not there


def run(args: argparse.Namespace) -> int:
    fmt = output_format(args)
    sections = None
    if args.sections:
        sections = check_sections([s for part in args.sections for s in part.split(",") if s])
    if os.path.lexists(args.source) and not os.path.isdir(args.source):
        regular_file(args.source, "SOURCE")  # a FIFO or a device is refused before anything opens it
    elif str(args.source).endswith(RUN_SUFFIXES):
        raise InspectorError(f"run file {args.source} does not exist; give the path of a file that "
                             "watch(...), check_step or `python -m inspector watch` wrote")
    if is_run_file(args.source) or is_watch_file(args.source):  # a run file of either kind
        report = run_report(read_run(args.source))
        progress(report.section("findings").note)  # the run's first error, or what it holds instead
    elif str(args.source).endswith(".captures.safetensors"):
        run_file = re.sub(r"(\.rank\d+)?\.captures\.safetensors$", "", str(args.source))
        raise InspectorError(f"{args.source} holds the captures a watched run stored next to its run file; "
                             f"report the run file, which includes them: report {run_file} -o ...")
    else:
        options = options_from_args(args)
        loaded = load_from_args(args)
        report = build_report(loaded, sections, progress=progress, **options)
    out = Path(args.output)
    progress(f"rendering {fmt}")
    if fmt == "pdf":
        report.to_pdf(out)
    else:
        text = {"html": report.to_html, "json": report.to_json, "md": report.to_markdown}[fmt]()
        write_text(out, text)
    for s in report.sections:
        if s.status != "ok":
            progress(f"section {s.id} {s.status}: {s.note}")
    skipped = [s.id for s in report.sections if s.status != "ok"]
    counts = {sev: sum(1 for _, f in report.findings if f.severity == sev)
              for sev in ("error", "warning", "info")}
    progress(f"wrote {out} ({format_bytes(out.stat().st_size)}); findings: {counts['error']} errors, "
             f"{counts['warning']} warnings, {counts['info']} info"
             + (f"; not included: {', '.join(skipped)}" if skipped else ""))
    return 0
