"""``python -m inspector report SOURCE --format html|json|md|pdf -o FILE``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..findings import InspectorError
from ..report import SECTIONS, build_report
from ._common import add_source_arguments, load_from_args, progress

HELP = "write a report of every analysis (HTML, JSON, Markdown or PDF)"
FORMATS = {"html": ".html", "json": ".json", "md": ".md", "pdf": ".pdf"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)
    parser.add_argument("--sections", nargs="+", default=None, metavar="SECTION",
                        help=f"sections to include (default: all): {', '.join(SECTIONS)}")
    parser.add_argument("--format", choices=list(FORMATS), default=None,
                        help="output format (default: from the -o file's extension, else html)")
    parser.add_argument("-o", "--output", required=True, help="file to write")
    parser.add_argument("--batch-size", type=int, default=None, help="batch size of the example inputs")
    parser.add_argument("--backward", action="store_true",
                        help="run one backward pass so the report has gradient norms")
    parser.add_argument("--max-memory", default=None, metavar="JSON",
                        help='device budget for the device-map plan, e.g. \'{"0": "2GiB", "cpu": "8GiB"}\'')


def _format(args: argparse.Namespace) -> str:
    if args.format:
        return args.format
    suffix = Path(args.output).suffix.lower()
    for name, ext in FORMATS.items():
        if suffix == ext or (name == "md" and suffix == ".markdown"):
            return name
    return "html"


def _options(args: argparse.Namespace) -> dict:
    options: dict = {}
    if args.batch_size is not None:
        if args.batch_size < 1:
            raise InspectorError(f"--batch-size must be at least 1, got {args.batch_size}")
        options["batch_size"] = args.batch_size
    if args.backward:
        options["backward"] = True
    if args.max_memory:
        try:
            budget = json.loads(args.max_memory)
        except json.JSONDecodeError as exc:
            raise InspectorError(f"--max-memory is not JSON ({exc.msg}); write it like "
                                 '\'{"0": "2GiB", "cpu": "8GiB"}\'') from None
        if not isinstance(budget, dict):
            raise InspectorError("--max-memory must be a JSON object of device to size")
        options["max_memory"] = budget
    return options


def run(args: argparse.Namespace) -> int:
    fmt = _format(args)
    if args.sections:
        sections = [s for part in args.sections for s in part.split(",") if s]
    else:
        sections = None
    options = _options(args)
    loaded = load_from_args(args)
    report = build_report(loaded, sections, progress=progress, **options)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    progress(f"rendering {fmt}")
    if fmt == "pdf":
        report.to_pdf(out)
    else:
        text = {"html": report.to_html, "json": report.to_json, "md": report.to_markdown}[fmt]()
        out.write_text(text, encoding="utf-8")
    skipped = [s.id for s in report.sections if s.status != "ok"]
    counts = {sev: sum(1 for _, f in report.findings if f.severity == sev)
              for sev in ("error", "warning", "info")}
    progress(f"wrote {out} ({out.stat().st_size} bytes); findings: {counts['error']} errors, "
             f"{counts['warning']} warnings, {counts['info']} info"
             + (f"; skipped: {', '.join(skipped)}" if skipped else ""))
    return 0
