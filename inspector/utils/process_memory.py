"""This process's resident memory, read the same way by ``watch`` and ``check_step``."""

from __future__ import annotations

import math
import resource
import sys


def rss_and_peak() -> tuple[float, float]:
    """This process's resident set size and its peak, in bytes: the current value from
    ``/proc/self/statm`` (one line), the peak from ``getrusage`` (the kernel's high-water mark, VmHWM),
    never below the current value; elsewhere the peak only and no current value (NaN). Cheap enough
    for every step (tens of microseconds).

    >>> rss, peak = rss_and_peak()
    >>> peak >= rss or math.isnan(rss)
    True
    """
    peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * _MAXRSS_UNIT
    try:
        with open("/proc/self/statm", "rb") as fh:
            rss = float(int(fh.read().split()[1]) * _PAGE)
    except (OSError, ValueError, IndexError):
        return math.nan, peak
    return rss, max(rss, peak)


_PAGE = resource.getpagesize()
_MAXRSS_UNIT = 1.0 if sys.platform == "darwin" else 1024.0  # macOS counts ru_maxrss in bytes, Linux in KiB
