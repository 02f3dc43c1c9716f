"""``python -m inspector checkpoint PATH``: the tensors (and pieces) of a checkpoint, without a model."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..distributed import is_dcp_folder
from ..loading import checkpoint_listing
from ..utils import terminal_line
from . import argtypes as types
from .common import print_findings, print_table, say, write_json

HELP = ("list the tensors of a checkpoint: a .safetensors/.pt/.bin file, a sharded or Hugging Face folder, "
        "or a torch.distributed.checkpoint folder with the pieces each tensor is stored in (nothing in it "
        "is executed)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path", type=types.checkpoint, help="checkpoint file, torch.distributed.checkpoint folder, or a "
        "folder of weight files (sharded or plain Hugging Face, read through its index)"
    )
    parser.add_argument("--max-rows", type=types.rows, default=60, help="rows to print")
    parser.add_argument("--json", default=None, type=types.output_file, metavar="PATH",
                        help="write the listing as JSON")


def run(args: argparse.Namespace) -> int:
    table, findings = checkpoint_listing(args.path)
    shown = terminal_line(args.path)
    if is_dcp_folder(args.path):
        say(f"distributed checkpoint {shown}: {len(table)} entries, {int(table['pieces'].sum())} pieces "
              f"in {len({f for fs in table['files'] for f in fs.split(', ') if f})} files")
    elif Path(args.path).is_dir():
        say(f"checkpoint folder {shown}: {len(table)} tensors")
    else:
        say(f"checkpoint {shown}: {len(table)} tensors")
    print_table(table, args.max_rows, more="--max-rows N")
    print_findings(findings)
    if args.json:
        write_json(args.json, table.to_dict(orient="records"), strict=True)
    return 0
