"""Arguments and output helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import pandas as pd

from ..loading import LoadedModel, load_model
from ..utils import (
    Finding,
    InspectorError,
    format_bytes,
    format_number,
    sort_findings,
    terminal_line,
    terminal_text,
)
from . import argtypes as types


def add_source_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="sample:<name>, path/to/file.py:factory or hf:<local dir>")
    parser.add_argument(
        "--checkpoint",
        default=None,
        type=types.checkpoint,
        help=".safetensors or .pt/.bin file, or torch.distributed.checkpoint folder, to apply",
    )
    parser.add_argument("--max-model-size", default=None, metavar="SIZE", type=model_size,
                        help="largest Hugging Face model to build, e.g. 40GiB (estimated from config.json "
                             "first; default INSPECTOR_MAX_MODEL_SIZE, else half of this machine's memory)")
    parser.add_argument("--device", default=None, type=types.device,
                        help="cpu, cuda:N, mps or meta (default: cpu; meta for structure-only samples)")
    parser.add_argument(
        "--dtype", default=None, type=types.dtype, help="float32, float16, bfloat16 or float64"
    )


def model_size(text: str) -> int:
    """``--max-model-size``: bytes or a size with a unit (``40GiB``), checked while parsing."""
    from ..placement import parse_size

    try:
        return parse_size(text, "--max-model-size")
    except InspectorError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--max-model-size: ")) from None


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
    return load_model(args.source, checkpoint=args.checkpoint, device=device, dtype=args.dtype,
                      max_model_size=getattr(args, "max_model_size", None))


@contextmanager
def training_ranks(source: str, device_kind: str,
                   group: bool = True) -> Iterator[tuple[int, int, Any, LoadedModel]]:
    """``(rank, world, device, loaded)`` inside the process group (torchrun's, else one rank):
    this rank's device and the model ``source`` loaded onto it, which must define a loss. The model
    is built inside the group, so a factory may use ``torch.distributed`` (a device mesh);
    ``group=False``: one process and no process group at all.

    Raises:
        InspectorError: the model file defines no ``loss(outputs, inputs)``.
    """
    from ..distributed import process_group, rank_device

    with process_group(device_kind) if group else nullcontext((0, 1)) as (rank, world):
        device = rank_device(device_kind)
        loaded = load_model(source, device=str(device))
        if not loaded.has_loss:
            raise InspectorError(
                f"{loaded.source} defines no loss(outputs, inputs); the file must define one to train"
            )
        yield rank, world, device, loaded


def say(text: Any = "") -> None:
    """Print one line of command output; names in it cannot restyle, rewrite or link the terminal."""
    print(_printable(terminal_text(text)))


def progress(message: str) -> None:
    """One line of progress on stderr; a line break in a name in it shows as ``\\x0a``."""
    print(f"... {_printable(terminal_line(message))}", file=sys.stderr, flush=True)


def _printable(text: str) -> str:
    r"""``text`` with lone surrogates written as escapes: the bytes of a file name that is not UTF-8
    as ``\xff``, any other as ``\ud800``."""
    text = _NAME_BYTES.sub(lambda m: f"\\x{ord(m.group()) - 0xDC00:02x}", text)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_NAME_BYTES = re.compile("[\udc80-\udcff]")  # how Python reads the bytes of a file name that are not UTF-8


def print_table(df: pd.DataFrame, max_rows: int | None = None, *, more: str = "") -> None:
    """The one table printer of the command line: every row of ``df``, whole (never pandas' ``..`` rows),
    each cell in human units (:func:`table_cells`). With ``max_rows``, at most that many, and then a line
    saying how many were left out and ``more``, the option that shows them (``"--max-rows N"``)."""
    if max_rows is not None and not more:
        raise ValueError("a table cut at max_rows names the option that shows the rest")
    shown = df if max_rows is None else df.head(max_rows)
    with pd.option_context("display.max_rows", None, "display.max_columns", None,
                           "display.width", None, "display.max_colwidth", 60):
        say(table_cells(shown).to_string(index=False))
    if len(shown) < len(df):
        left = len(df) - len(shown)
        say(f"({left} more {'row' if left == 1 else 'rows'} not shown, {len(df)} in all: {more} shows them)")


def table_cells(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` as text for a terminal: a measured number with 4 significant digits (``format_number``), a
    ``*bytes`` column in binary units (``format_bytes``), and an empty cell for a number that is missing
    (NaN, None, ``<NA>``: a tensor that was zero in A has no ``rel_change``); text and whole numbers
    as they are."""
    cells = []  # built column by column, then one frame (inserting each column into a frame is quadratic)
    for _, col in df.items():
        if str(col.name).endswith("bytes") and pd.api.types.is_numeric_dtype(col):
            cells.append([_cell(v, format_bytes) for v in col])
        elif pd.api.types.is_float_dtype(col) or col.dtype == object:
            cells.append([_cell(v, format_number) for v in col])
        else:
            cells.append([_cell(v, str) for v in col])
    out = pd.DataFrame(dict(zip(range(len(cells)), cells, strict=True)), index=df.index)
    out.columns = df.columns
    return out


def _cell(value: Any, number: Any) -> str:
    if value is None or value is pd.NA or value is pd.NaT:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (float, np.floating)):
        x = float(value)
        if x != x:
            return ""
        whole = number is format_number and x.is_integer() and abs(x) < 1e15
        return str(int(x)) if whole else number(x)  # a count read as a float stays a count
    if isinstance(value, (int, np.integer)):
        return number(int(value)) if number is format_bytes else str(int(value))
    return str(value)


def print_findings(findings: list[Finding]) -> None:
    if not findings:
        say("findings: none")
        return
    say(f"findings ({len(findings)}):")
    for f in sort_findings(findings):
        where = f" [{terminal_line(f.where)}]" if f.where else ""  # a name cannot start a line of its own
        say(f"  {f.severity.upper():7} {f.code}{where}: {terminal_line(f.message)}")


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` as UTF-8 (characters that are not text, such as lone surrogates, escaped);
    a failed write (a full disk, ``/dev/full``) is an InspectorError naming the file."""
    safe = text.encode("utf-8", "backslashreplace").decode("utf-8")
    with types.open_output(path) as fh:  # a regular file only; never blocks on a FIFO
        try:
            fh.write(safe)
            fh.flush()
        except OSError as exc:
            raise InspectorError(
                f"{os.fsdecode(path)} cannot be written ({exc.strerror or type(exc).__name__}); "
                "give a file on a disk with room, which you may write"
            ) from None


def strict_json(data: Any) -> Any:
    """``data`` as values strict JSON parsers take, every digit kept: the report's :func:`plain`
    (a float that is not finite becomes ``"nan"``, ``"inf"`` or ``"-inf"``, pandas' missing values
    ``None``, numpy scalars Python ones, tuples lists).

    >>> strict_json({"a": [float("inf"), 1.5, (2, float("nan"))]})
    {'a': ['inf', 1.5, [2, 'nan']]}
    """
    from ..report import plain

    return plain(data, digits=None)


def write_json(path: str, data: Any, *, strict: bool = False) -> None:
    """Write ``data`` as JSON; ``strict``: through :func:`strict_json`, so that no ``NaN`` or
    ``Infinity`` (which strict parsers refuse) is written."""
    text = json.dumps(strict_json(data), indent=2, allow_nan=False) if strict else \
        json.dumps(data, indent=2, default=str)
    write_text(path, text)
    progress(f"wrote {path}")


FAIL_ON = ("error", "warning", "never")


def add_fail_on(parser: argparse.ArgumentParser) -> None:
    """``--fail-on error|warning|never``: the exit status a CI job can gate on."""
    parser.add_argument("--fail-on", choices=FAIL_ON, default="never",
                        help="exit 1 when a finding is this severe or more, for CI (default never)")


def failing_status(findings: Sequence[Finding], fail_on: str | None, quiet: bool = False) -> int:
    """1 (saying why, unless ``quiet``) when a finding is at least as severe as ``fail_on``
    (``error`` or ``warning``), else 0; ``never`` or None: always 0."""
    levels = {"error": {"error"}, "warning": {"error", "warning"}}.get(fail_on or "", set())
    hits = [f for f in findings if f.severity in levels]
    if hits:
        if not quiet:
            say(f"failing (--fail-on {fail_on}): {len(hits)} findings at {fail_on} or above")
        return 1
    return 0
