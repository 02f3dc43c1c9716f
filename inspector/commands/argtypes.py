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
import stat
from pathlib import Path
from typing import IO

from ..loading import DTYPES, resolve_device
from ..utils import InspectorError, file_kind


class IntRange:
    """argparse type: a whole number from ``low`` to ``high``, both included.

    Every numeric option has an upper bound, so a mistyped ``--steps 1000000000`` stops at
    once with a message instead of running out of memory later; ``hint`` says why the bound
    is where it is.

    >>> IntRange(1, 100, "more steps cost time")("50")
    50
    >>> IntRange(1, 100, "more steps cost time")("500")
    Traceback (most recent call last):
    ...
    argparse.ArgumentTypeError: must be a whole number of at most 100 (more steps cost time), got 500
    """

    def __init__(self, low: int, high: int, hint: str = "") -> None:
        self.low, self.high, self.hint = low, high, hint
        self.__name__ = "whole number"  # what argparse calls the value in its own messages

    def __call__(self, text: str) -> int:
        value = _int(text)
        if value < self.low:
            least = "0 or more" if self.low == 0 else f"at least {self.low}"
            raise argparse.ArgumentTypeError(f"must be a whole number of {least}, got {text}")
        if value > self.high:
            hint = f" ({self.hint})" if self.hint else ""
            raise argparse.ArgumentTypeError(f"must be a whole number of at most {self.high}{hint}, "
                                             f"got {_shown(text)}")
        return value


class FloatRange:
    """argparse type: a finite number above ``above`` (or equal to it, with ``inclusive``) and at most
    ``high``.

    >>> FloatRange(0.0, 10.0)("0.5"), FloatRange(0.0, 1.0, inclusive=True)("0")
    (0.5, 0.0)
    """

    def __init__(self, above: float, high: float, hint: str = "", inclusive: bool = False) -> None:
        self.above, self.high, self.hint, self.inclusive = above, high, hint, inclusive
        self.__name__ = "number"

    def __call__(self, text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a number, got {_shown(text)!r}") from None
        if not math.isfinite(value) or value < self.above or (value == self.above and not self.inclusive):
            raise argparse.ArgumentTypeError(
                f"must be a finite number {'of at least' if self.inclusive else 'above'} {self.above:g}, "
                f"got {_shown(text)}"
            )
        if value > self.high:
            hint = f" ({self.hint})" if self.hint else ""
            raise argparse.ArgumentTypeError(f"must be at most {self.high:g}{hint}, got {_shown(text)}")
        return value


# Bounds of the command-line options (a command may choose tighter ones).
MAX_INDEX = 2**62  # flat indices, byte budgets: past any tensor or memory that exists
positive_int = IntRange(1, 2**31 - 1)
"""A whole number of at least 1 (and at most 2**31 - 1)."""
non_negative_int = IntRange(0, MAX_INDEX)
"""A whole number of 0 or more (byte budgets, flat indices), at most 2**62."""
batch_size = IntRange(1, 4096, "the example inputs of this many rows are built in memory at once")
steps = IntRange(1, 10_000, "each step is a forward and backward pass; 50 to 300 is usual")
rows = IntRange(1, 1_000_000, "rows printed to the terminal")
train_steps = IntRange(1, 1_000_000, "training steps to run")
port = IntRange(1, 65535, "a TCP port")
class_index = IntRange(0, 2**31 - 1, "an index into the model's output")
position = IntRange(-(2**31), 2**31 - 1, "a position in the sequence")
positive_float = FloatRange(0.0, 1e6, "a learning rate")
"""A finite number above 0 (learning rates), at most 1e6."""
tolerance = FloatRange(0.0, 1e6, "a relative difference", inclusive=True)
"""A finite number of 0 or more (relative tolerances; 0 is exact), at most 1e6."""


def _shown(text: str) -> str:
    """``text`` for a message: long values are cut (a 5,000-digit number stays one line)."""
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} characters)"


def _int(text: str) -> int:
    if len(text.strip()) > 40:  # before int(): Python refuses more than 4,300 digits with its own message
        raise argparse.ArgumentTypeError(f"must be a whole number of at most 40 digits, got {_shown(text)}")
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {_shown(text)!r}") from None


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
    special = file_kind(path)
    if special == "a folder":
        raise argparse.ArgumentTypeError(f"{path} is not a file; give the path of a file")
    if special:  # checked before anything opens it: a FIFO blocks the reader, a device never ends
        raise argparse.ArgumentTypeError(f"{path} is {special}, not a regular file; give the path of a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{path} cannot be read; check its permissions")
    return str(path)


def checkpoint(text: str) -> str:
    """An existing checkpoint file, a torch.distributed.checkpoint folder (with its ``.metadata``), or a
    folder of weight files (sharded or plain Hugging Face: ``*.safetensors``, ``pytorch_model.bin``,
    an index)."""
    path = Path(text).expanduser()
    if path.is_dir():
        from ..loading import folder_files

        try:
            found = folder_files(path)
        except InspectorError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not (path / ".metadata").is_file() and found is None:
            raise argparse.ArgumentTypeError(
                f"{path} is not a file, nor a torch.distributed.checkpoint folder (it has no .metadata "
                "file), nor a folder of weight files (no .safetensors file, pytorch_model.bin or index); "
                "give a checkpoint file or such a folder"
            )
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
    special = _special_file(path)
    if special:
        raise argparse.ArgumentTypeError(
            f"{path} is {special}, not a regular file; writing there could block "
            "or go nowhere: give a regular file name"
        )
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


_special_file = file_kind  # what a path is when it exists and is not a regular file


def open_output(path: str | os.PathLike[str], mode: str = "w") -> IO[str]:
    """Open ``path`` for writing text, refusing anything but a regular file; never blocks.

    The file is opened without blocking (a FIFO with no reader fails at once) and checked
    after opening, so a FIFO or device put in its place after the arguments were checked
    is refused too, with an :class:`~inspector.InspectorError`.
    """
    special = _special_file(Path(path))
    if special:
        raise InspectorError(f"{path} is {special}, not a regular file; give a regular file name")
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_APPEND if mode == "a" else 0
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        raise InspectorError(
            f"{path} cannot be written ({exc.strerror or exc}); give a regular file in a folder "
            "you can write to"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InspectorError(
            f"{path} is not a regular file (a FIFO, a device or a socket); give a regular file name"
        )
    if mode == "w":
        os.ftruncate(fd, 0)
    if hasattr(os, "set_blocking"):
        os.set_blocking(fd, True)
    return open(fd, mode, encoding="utf-8")
