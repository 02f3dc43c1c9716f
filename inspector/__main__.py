"""Command line: ``python -m inspector COMMAND SOURCE ...``.

Each command lives in ``inspector/commands/<name>.py`` with ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``; they are found by name. Only the
chosen command's module is imported: the list in ``--help`` reads each ``HELP`` from its
source file without running it.
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import pkgutil
import sys
import traceback
from pathlib import Path

from . import commands
from .utils.escaping import terminal_line, terminal_text
from .utils.findings import InspectorError, first_line
from .utils.program import program_name


@functools.cache
def _help_assignment(name: str) -> ast.Assign | None:
    """The top-level ``HELP = ...`` of ``inspector/commands/<name>.py``, read without running it."""
    try:
        tree = ast.parse((Path(commands.__path__[0]) / f"{name}.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    return next((node for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "HELP" for t in node.targets)), None)


def command_names() -> list[str]:
    """Every command, sorted: the modules of ``inspector/commands`` that define ``HELP`` (the others,
    ``common`` and ``argtypes``, are what the commands share)."""
    return sorted(m.name for m in pkgutil.iter_modules(commands.__path__)
                  if not m.name.startswith("_") and _help_assignment(m.name) is not None)


def _help_text(name: str) -> str:
    """The command's ``HELP``, read from its source when it is a plain string literal, else imported."""
    node = _help_assignment(name)
    if node is not None:
        try:
            value = ast.literal_eval(node.value)
        except ValueError:
            value = None
        if isinstance(value, str):
            return value
    return importlib.import_module(f"{commands.__name__}.{name}").HELP


def _chosen(argv: list[str], names: list[str]) -> str | None:
    """The command named in ``argv``: the first word that is not an option (the top-level options
    take no value)."""
    for word in argv:
        if word == "--":
            continue
        if not word.startswith("-"):
            return word if word in names else None
    return None


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The command-line parser; with ``argv``, only the command it names gets its arguments (and
    only that command's module is imported); without, every command does."""
    parser = argparse.ArgumentParser(
        prog=program_name(), description="Debug PyTorch models: ties, offsets, device maps, captures."
    )
    parser.add_argument("--debug", action="store_true", help="print the full traceback of an error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    names = command_names()
    chosen = _chosen(argv, names) if argv is not None else None
    for name in names:
        if argv is not None and name != chosen:
            sub.add_parser(name, help=_help_text(name))
            continue
        mod = importlib.import_module(f"{commands.__name__}.{name}")
        p = sub.add_parser(name, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="print the full traceback of an error")
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; every failure is exit status 2 with one line on stderr naming the fix.

    Bad arguments are refused by argparse before anything runs. While a command runs, an
    ``InspectorError`` prints its message; anything else (a bug, or the model's own code
    exiting) prints one line too, with the traceback only under ``--debug``.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(argv)
        args, unknown = parser.parse_known_args(argv)
        if unknown and not getattr(args, "_passthrough", False):
            parser.error(f"unrecognized arguments: {' '.join(unknown)}")
        args.passthrough = unknown
    except SystemExit as exc:  # argparse printed the usage error (status 2) or --help (status 0)
        return exc.code if isinstance(exc.code, int) else 2
    debug = bool(getattr(args, "debug", False))
    try:
        return int(args._run(args) or 0)
    except InspectorError as exc:
        return _fail(str(exc), debug)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # model code that called sys.exit outside the places that catch it
        return _fail(f"code run by the command called sys.exit({exc.code!r}); fix the model file so "
                     "that it returns or raises instead", debug)
    except Exception as exc:  # noqa: BLE001 - a bug must not end in a raw traceback either
        text = first_line(exc)
        return _fail(f"unexpected {type(exc).__name__}" + (f": {text}" if text else "")
                     + ". Run again with --debug for the traceback and report it as a bug.", debug)


def _fail(message: str, debug: bool) -> int:
    if debug:
        print(terminal_text(traceback.format_exc()), end="", file=sys.stderr)
    print(f"error: {terminal_line(message)}", file=sys.stderr)  # one error, one line: a name cannot add one
    return 2


if __name__ == "__main__":
    sys.exit(main())
