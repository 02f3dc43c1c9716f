"""Command line: ``python -m inspector COMMAND SOURCE ...``.

Each command lives in ``inspector/commands/<name>.py`` with ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``; they are found by name.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys

from . import commands
from .findings import InspectorError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m inspector",
                                     description="Debug PyTorch models: ties, offsets, device maps, captures.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        mod = importlib.import_module(f"{commands.__name__}.{info.name}")
        p = sub.add_parser(info.name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except InspectorError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
