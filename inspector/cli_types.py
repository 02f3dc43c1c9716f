"""argparse types: every command-line value is checked while the arguments are parsed.

A bad value stops the command before it loads a model or runs an analysis, with exit
status 2 and one line that names the option and what to give instead. Output files are
checked too (the folder exists and a file can be written there), so a long analysis never
ends in an unwritable path.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from .devices import resolve_device
from .findings import InspectorError
from .models import DTYPES


def positive_int(text: str) -> int:
    """A whole number of at least 1 (batch sizes, steps, rows)."""
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text}")
    return value


def non_negative_int(text: str) -> int:
    """A whole number of 0 or more (byte budgets, flat indices)."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a whole number of 0 or more, got {text}")
    return value


def positive_float(text: str) -> float:
    """A finite number above 0 (learning rates)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None


def device(text: str) -> str:
    """A device that exists on this machine (cpu, cuda:N, mps, meta)."""
    try:
        return str(resolve_device(text))
    except InspectorError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def dtype(text: str) -> str:
    """A floating-point dtype name."""
    key = text.removeprefix("torch.")
    if key not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; choose one of {', '.join(DTYPES)}")
    return key


def input_file(text: str) -> str:
    """An existing, readable file (a checkpoint, a device map)."""
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{path} does not exist; give the path of an existing file")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{path} is not a file; give the path of a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{path} cannot be read; check its permissions")
    return str(path)


def checkpoint(text: str) -> str:
    """An existing checkpoint file, or a torch.distributed.checkpoint folder (with its ``.metadata``)."""
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / ".metadata").is_file():
            raise argparse.ArgumentTypeError(f"{path} is not a file, nor a torch.distributed.checkpoint folder "
                                             "(it has no .metadata file); give a checkpoint file or such a folder")
        return str(path)
    return input_file(text)


def output_file(text: str) -> str:
    """A file that can be written: its folder exists (it is never created) and takes a new file.

    The check opens the file for appending (an existing file is not changed) or creates it and
    removes it again, so it holds for read-only mounts, /proc and missing permissions alike.
    """
    path = Path(text).expanduser()
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a file name such as report.html")
    folder = path.parent
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"folder {folder} does not exist; create it first or write to "
                                         "an existing folder")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{path} is a folder; give a file name inside it")
    existed = path.exists()
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{path} cannot be written ({exc.strerror or exc}); choose a "
                                         "file in a folder you can write to") from None
    finally:
        if not existed and path.is_file():
            path.unlink()
    return str(path)
