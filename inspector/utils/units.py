"""Numbers for people: bytes in binary units and counts in words, the one spelling everywhere.

Pages, figures, error messages, the CLI and the reports all write sizes with
:func:`format_bytes` (``KiB``, ``MiB``, ``GiB``: powers of 1024, as device budgets are given)
and counts with :func:`format_count` (``thousand``, ``million``, ``billion``: never ``B``,
which a reader takes for bytes). This module imports nothing from the package.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
COUNT_UNITS = (("trillion", 1e12), ("billion", 1e9), ("million", 1e6))


def format_bytes(n: float | None, digits: int = 1) -> str:
    """Bytes in binary units: ``1536 -> '1.5 KiB'``; whole bytes below 1 KiB.

    >>> format_bytes(512), format_bytes(1536), format_bytes(40 * 2**30), format_bytes(155_171_243_763)
    ('512 B', '1.5 KiB', '40.0 GiB', '144.5 GiB')
    >>> format_bytes(-2048), format_bytes(None), format_bytes(float("nan"))
    ('-2.0 KiB', '—', '—')
    """
    if n is None or isinstance(n, float) and not math.isfinite(n):
        return "—"
    value = float(n)
    for unit in BYTE_UNITS:
        if abs(value) < 1024 or unit == BYTE_UNITS[-1]:
            return f"{int(value)} B" if unit == "B" else f"{value:.{digits}f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def format_count(n: float | None, exact_below: int = 1_000_000) -> str:
    """A count: exact with separators below ``exact_below``, else in millions, billions, trillions.

    >>> format_count(4080), format_count(124_439_808), format_count(68_976_648_192)
    ('4,080', '124.4 million', '69.0 billion')
    >>> format_count(2_500, exact_below=1000), format_count(None)
    ('2.5 thousand', '—')
    """
    if n is None or isinstance(n, float) and not math.isfinite(n):
        return "—"
    if abs(n) < exact_below:
        return f"{int(n):,}" if float(n).is_integer() else f"{n:,.3g}"
    for unit, size in (*COUNT_UNITS, ("thousand", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n):,}"


def format_number(x: float | None, digits: int = 4) -> str:
    """A measured value (a norm, a difference) with ``digits`` significant digits, never 16.

    >>> format_number(0.123456789), format_number(1234567.0), format_number(0.0), format_number(3e-9)
    ('0.1235', '1.235e+06', '0', '3e-09')
    """
    if x is None:
        return "—"
    return f"{x:.{digits}g}"


def bytes_ticks(top: float, count: int = 6, *, bottom: float | None = None) -> tuple[list[float], list[str]]:
    """Axis ticks for a bytes axis from 0 to ``top``: round steps in a binary unit, labelled by it.
    With ``bottom``, for a log axis over ``bottom``..``top``: 1 and 32 of each binary unit (1, 4,
    16, 64 and 256 when that gives fewer than 3 ticks).

    >>> bytes_ticks(45 * 2**30)[1][:3]
    ['0 B', '10.0 GiB', '20.0 GiB']
    >>> bytes_ticks(0)
    ([0.0], ['0 B'])
    >>> bytes_ticks(6e8, bottom=3000)[1]
    ['1.0 KiB', '32.0 KiB', '1.0 MiB', '32.0 MiB', '1.0 GiB']
    """
    if bottom is not None:
        vals: list[float] = []
        for steps in ((1, 32), (1, 4, 16, 64, 256)):
            vals = [1024.0**k * m for k in range(6) for m in steps if bottom / 4 <= 1024.0**k * m <= top * 4]
            if len(vals) >= 3:
                break
        return vals, [format_bytes(v) for v in vals]
    if not top or top <= 0 or not math.isfinite(top):
        return [0.0], ["0 B"]
    unit = 1024 ** min(int(math.log(top, 1024)), len(BYTE_UNITS) - 1)
    raw = top / unit / max(count - 1, 1)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw) * unit
    ticks = [i * step for i in range(int(top // step) + 2)]
    return ticks, [format_bytes(t) for t in ticks]


def format_budget(budget: Mapping[Any, int]) -> str:
    """A device budget for people: ``0: 144.5 GiB, cpu: 513.9 GiB``.

    >>> format_budget({0: 155_171_243_763, "cpu": 2**30})
    '0: 144.5 GiB, cpu: 1.0 GiB'
    """
    return ", ".join(f"{d}: {format_bytes(n)}" for d, n in budget.items())


def progress_text(share: float, elapsed: float) -> str:
    """``"40% done, about 1 min 20 s left"`` from the share done and the seconds it took.

    >>> progress_text(0.4, 40.0), progress_text(0.2, 30.0), progress_text(0.01, 5.0)
    ('40% done, about 60 s left', '20% done, about 2 min 0 s left', '1% done')
    """
    if share <= 0.02 or elapsed < 1:
        return f"{share:.0%} done"
    left = elapsed * (1 - share) / share
    return (
        f"{share:.0%} done, about "
        + (f"{left:.0f} s" if left < 90 else f"{left // 60:.0f} min {left % 60:.0f} s")
        + " left"
    )
