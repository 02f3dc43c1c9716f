"""Sizes people write (``"20GiB"``, ``"1.5 GB"``, ``4096``) read as bytes, the same way everywhere."""

from __future__ import annotations

import math
import re
from typing import Any

from .findings import InspectorError

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
_ACCELERATE_UNITS = frozenset({"KB", "MB", "GB", "KIB", "MIB", "GIB"})  # convert_file_size_to_int's
_EXAMPLES = "20GiB, 500MB or 4096"
_MAX_DIGITS = 1000  # under the 4,300 digits Python reads as an int
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_size(value: int | float | str, what: str = "size") -> int:
    """Bytes from ``1024``, ``"20GiB"``, ``"1.5 GB"`` or ``"300MB"`` (GB = 10**9, GiB = 2**30).

    Units are read in any case (``"300mb"`` is 300 * 10**6 bytes, never bits) and may be
    ``B``, ``KB``/``MB``/``GB``/``TB`` or ``KiB``/``MiB``/``GiB``/``TiB``; a number without a
    unit is bytes. The kB-to-GiB forms go through accelerate's ``convert_file_size_to_int``,
    so a budget means the same bytes here as in ``max_memory``; whole numbers of bytes stay
    exact at any size.

    Args:
        value: bytes (an int or a finite float) or a size text.
        what: the name of the field, used in error messages.

    Raises:
        InspectorError: naming ``what`` and saying what to write, for text that is not a size,
            a negative size or one that is not finite.

    >>> parse_size("20GiB"), parse_size("1.5KB"), parse_size(7), parse_size("2tib")
    (21474836480, 1500, 7, 2199023255552)
    """
    if isinstance(value, bool):
        raise InspectorError(f"{what}: {value!r} is not a size")
    if isinstance(value, (int, float)):
        return _checked_bytes(value, value, what)
    match = _SIZE.match(str(value))
    if not match or match.group(2).upper() not in _UNITS:
        raise InspectorError(f"{what}: cannot read {value!r} as a size; write bytes or a number "
                             f"with a unit such as {_EXAMPLES}")
    number, unit = match.group(1), match.group(2).upper()
    if (
        len(number.lstrip("0")) > _MAX_DIGITS
    ):  # no memory is that large; int() would also refuse 4,300+ digits
        raise InspectorError(f"{what}: {str(value)[:20]}... ({len(number)} digits) is far larger than any "
                             f"memory; write bytes or a number with a unit such as {_EXAMPLES}")
    if unit in _ACCELERATE_UNITS:
        # upper case: accelerate reads a final lower-case "b" as bits ("5Gb" = 5 * 10**9 / 8)
        return _checked_bytes(_accelerate_size(number + unit, value, what), value, what)
    if "." not in number:
        return int(number) * _UNITS[unit]
    return _checked_bytes(float(number) * _UNITS[unit], value, what)


def _accelerate_size(text: str, value: Any, what: str) -> int | float:
    """``convert_file_size_to_int`` on ``text``; infinity where the number overflows a float."""
    # imported here: importing accelerate takes a while, and most callers never read a size
    from accelerate.utils import convert_file_size_to_int

    try:
        return convert_file_size_to_int(text)
    except OverflowError:  # int(float("1" * 400) * 2**30): not a finite number of bytes
        return math.inf
    except ValueError:
        raise InspectorError(f"{what}: cannot read {value!r} as a size; write bytes or a number "
                             f"with a unit such as {_EXAMPLES}") from None


def _checked_bytes(number: int | float, value: Any, what: str) -> int:
    """``number`` as whole bytes, or an InspectorError if it is negative or not finite."""
    if isinstance(number, float) and not math.isfinite(number):
        raise InspectorError(f"{what}: {value!r} is not a finite number of bytes; write bytes or a "
                             f"number with a unit such as {_EXAMPLES}")
    if number < 0:
        raise InspectorError(f"{what}: {value!r} is negative; write 0 or more bytes, such as {_EXAMPLES}")
    return int(number)
