"""``python -m inspector report SOURCE --format html|json|md|pdf -o FILE``."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import SECTIONS, InspectorError, build_report, run_report
from .. import cli_types as types
from ..cli_common import add_source_arguments, load_from_args, progress
from ..distributed import is_run_file, read_run
from ..report import check_options, check_sections

HELP = ("write a report of every analysis (HTML, JSON, Markdown or PDF); SOURCE may also be the "
        "JSON-lines file of a distributed run")
FORMATS = {"html": ".html", "json": ".json", "md": ".md", "pdf": ".pdf"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--sections", nargs="+", default=None, metavar="SECTION",
                        help=f"sections to include (default: all; findings always): {', '.join(SECTIONS)}")
    parser.add_argument("--format", choices=list(FORMATS), default=None,
                        help="output format (default: from the -o file's extension, else html)")
    parser.add_argument("-o", "--output", required=True, type=types.output_file, help="file to write")
    parser.add_argument("--batch-size", type=types.batch_size, default=None, help="batch size of the example inputs")
    parser.add_argument("--backward", action="store_true",
                        help="run one backward pass for gradient norms (earlier .grad values are put back)")
    parser.add_argument("--max-memory", default=None, metavar="BUDGET",
                        help="device budget for the device-map plan, e.g. 0=20GiB,1=20GiB,cpu=64GiB")
    parser.add_argument("--conversions", nargs="+", default=None, metavar="NAME",
                        help="conversion checks to run: names, 'all' or 'none' "
                             "(default: all of them on models up to 64 MiB)")
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
    check_options(options)
    return options


def run(args: argparse.Namespace) -> int:
    fmt = output_format(args)
    sections = None
    if args.sections:
        sections = check_sections([s for part in args.sections for s in part.split(",") if s])
    if is_run_file(args.source):  # a distributed run file: per-rank sections
        report = run_report(read_run(args.source))
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
        with types.open_output(out) as fh:
            fh.write(text)
    for s in report.sections:
        if s.status != "ok":
            progress(f"section {s.id} {s.status}: {s.note}")
    skipped = [s.id for s in report.sections if s.status != "ok"]
    counts = {sev: sum(1 for _, f in report.findings if f.severity == sev)
              for sev in ("error", "warning", "info")}
    progress(f"wrote {out} ({out.stat().st_size} bytes); findings: {counts['error']} errors, "
             f"{counts['warning']} warnings, {counts['info']} info"
             + (f"; not included: {', '.join(skipped)}" if skipped else ""))
    return 0
