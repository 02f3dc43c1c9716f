"""Arguments and output helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import pandas as pd

from . import cli_types as types
from .escaping import terminal_text
from .findings import Finding, sort_findings
from .models import LoadedModel, load_model


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="sample:<name>, path/to/file.py:factory or hf:<local dir>")
    parser.add_argument("--checkpoint", default=None, type=types.checkpoint,
                        help=".safetensors or .pt/.bin file, or torch.distributed.checkpoint folder, to apply")
    parser.add_argument("--device", default=None, type=types.device,
                        help="cpu, cuda:N, mps or meta (default: cpu; meta for structure-only samples)")
    parser.add_argument("--dtype", default=None, type=types.dtype, help="float32, float16, bfloat16 or float64")


def default_device(source: str) -> str:
    """cpu, or meta for structure-only samples."""
    if source.startswith("sample:"):
        from sample_models import SAMPLES

        sample = SAMPLES.get(source.removeprefix("sample:"))
        if sample is not None and sample.meta_only:
            return "meta"
    return "cpu"


def load_from_args(args: argparse.Namespace) -> LoadedModel:
    device = args.device or default_device(args.source)
    progress(f"loading {args.source} on {device}")
    return load_model(args.source, checkpoint=args.checkpoint, device=device, dtype=args.dtype)


def say(text: Any = "") -> None:
    """Print one line of command output; names in it cannot restyle, rewrite or link the terminal."""
    print(terminal_text(text))


def progress(message: str) -> None:
    print(f"... {terminal_text(message)}", file=sys.stderr, flush=True)


def print_table(df: pd.DataFrame, max_rows: int = 60) -> None:
    with pd.option_context("display.max_rows", max_rows, "display.max_columns", None,
                           "display.width", 200, "display.max_colwidth", 60):
        say(df.to_string(index=False) if len(df) <= max_rows else df)


def print_findings(findings: list[Finding]) -> None:
    if not findings:
        say("findings: none")
        return
    say(f"findings ({len(findings)}):")
    for f in sort_findings(findings):
        where = f" [{f.where}]" if f.where else ""
        say(f"  {f.severity.upper():7} {f.code}{where}: {f.message}")


def write_json(path: str, data: Any) -> None:
    with types.open_output(path) as fh:
        json.dump(data, fh, indent=2, default=str)
    progress(f"wrote {path}")
