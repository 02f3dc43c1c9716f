"""``python -m inspector labs list`` and ``labs collect REPORTS... -o class.csv``: the teacher's side of the
labs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from ..labs import TEACHER_KEY_ENV, Lab, LabError, class_rows, discover_labs, read_results
from ..utils import InspectorError, terminal_line
from . import argtypes as types
from .common import print_table, say, write_text

HELP = ("the classroom labs: list them, or collect the students' results files (or Markdown lab reports) "
        "into one table of the class, each file's checksum verified")

COLUMNS = ["student", "lab", "task", "passed", "attempts", "time", "file"]
MAX_BYTES = 5 * 2**20  # a results file of a whole course is a few kB


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="labs_command", required=True, metavar="ACTION")
    sub.add_parser("list", help="every lab: the package's own and those in INSPECTOR_LABS_DIR",
                   description="every lab: the package's own and those in INSPECTOR_LABS_DIR")
    collect = sub.add_parser(
        "collect", help="one CSV table of the class from the students' results files",
        description="One CSV row per student, lab and task tried: passed, attempts, time (UTC). Files "
                    f"signed with the teacher key are verified with {TEACHER_KEY_ENV} (set it as the server "
                    "had it); a file whose checksum does not match is left out and named, and the status is "
                    "then 1.")
    collect.add_argument("reports", nargs="+", type=types.input_file, metavar="REPORT",
                         help="lab-results .json or lab report .md files the Labs page wrote")
    collect.add_argument("-o", "--output", required=True, type=types.output_file,
                         help="the CSV file to write (replaced)")


def run(args: argparse.Namespace) -> int:
    return _collect(args) if args.labs_command == "collect" else _list()


def _list() -> int:
    entries = discover_labs()
    rows = [{"id": e.id, "title": e.title, "tasks": len(e.tasks), "source": e.source or "package"}
            for e in entries if isinstance(e, Lab)]
    print_table(pd.DataFrame(rows, columns=["id", "title", "tasks", "source"]))
    for e in entries:
        if isinstance(e, LabError):
            _warn(f"lab {e.id} could not be loaded: {e.message}")
    return 0


def _collect(args: argparse.Namespace) -> int:
    rows: dict[tuple[str, str, str], dict] = {}  # one row per student, lab and task: the furthest record
    refused = 0
    counts = {"signed": 0, "checksum": 0}
    for path in args.reports:
        shown = Path(path).name
        try:
            if Path(path).stat().st_size > MAX_BYTES:
                raise InspectorError(f"{shown} is over {MAX_BYTES // 2**20} MiB: not a results file")
            verified = read_results(Path(path).read_bytes(), shown)
        except (InspectorError, OSError) as exc:
            refused += 1
            _warn(f"{exc}; left out")
            continue
        if verified.status == "tampered":
            refused += 1
            _warn(f"{shown} ({verified.student or 'no name'}): its checksum does not match: the file was "
                  "changed after the Labs page wrote it; left out")
            continue
        if verified.status == "unverifiable":
            refused += 1
            _warn(f"{shown} ({verified.student or 'no name'}) is signed with a teacher key: set "
                  f"{TEACHER_KEY_ENV} to the key the server had, then collect again; left out")
            continue
        counts[verified.status] += 1
        for row in class_rows(verified, shown):  # a student's results file and report hold the same tasks
            key = (row["student"], row["lab"], row["task"])
            if key not in rows or row["attempts"] > rows[key]["attempts"]:
                rows[key] = row
    table = pd.DataFrame(list(rows.values()), columns=COLUMNS)
    write_text(args.output, table.to_csv(index=False))
    if len(table):
        print_table(table)
    note = (f"; {counts['checksum']} with a plain checksum only (the server had no {TEACHER_KEY_ENV}: an "
            "edit whose author recomputed it would not show)" if counts["checksum"] else "")
    say(f"{len(args.reports)} file(s): {counts['signed'] + counts['checksum']} verified, {refused} left out"
        f"{note}; wrote {len(table)} row(s) to {args.output}")
    return 1 if refused else 0


def _warn(message: str) -> None:
    print(f"warning: {terminal_line(message)}", file=sys.stderr)
