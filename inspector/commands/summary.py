"""``python -m inspector summary SOURCE``."""

from __future__ import annotations

import argparse

from .. import format_bytes, model_summary, summary_findings
from .common import add_source_arguments, load_from_args, print_findings, print_table, say

HELP = "modules, parameter elements (unique and with aliases), buffers, bytes, trainable vs frozen"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_source_arguments(parser)


def run(args: argparse.Namespace) -> int:
    loaded = load_from_args(args)
    s = model_summary(loaded.model)
    say(f"model: {loaded.name} ({loaded.source}) on {loaded.device}")
    say(f"modules: {s.modules:,}")
    say(f"parameter elements: {s.parameter_elements:,} unique, "
          f"{s.parameter_elements_with_aliases:,} counting aliases ({s.parameters:,} tensors, "
          f"{s.parameter_names:,} names)")
    say(f"trainable: {s.trainable_elements:,}  frozen: {s.frozen_elements:,}")
    say(f"buffers: {s.buffers:,} tensors, {s.buffer_elements:,} elements")
    table = s.bytes_table.rename(columns={"bytes": "size"}).assign(
        size=s.bytes_table["bytes"].map(format_bytes)
    )
    print_table(table)
    print_findings(loaded.findings + summary_findings(s))
    return 0
