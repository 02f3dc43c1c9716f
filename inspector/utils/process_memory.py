"""This process's resident memory, read the same way by ``watch`` and ``check_step``."""

from __future__ import annotations

import math
import resource
import sys


def rss_and_peak() -> tuple[float, float]:
    """This process's resident set size and its peak, in bytes, from one reading of
    ``/proc/self/status`` (VmRSS, VmHWM: the same counters, so the peak is never below the
    current value); elsewhere the peak from ``getrusage`` and no current value (NaN).

    >>> rss, peak = rss_and_peak()
    >>> peak >= rss or math.isnan(rss)
    True
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        rss = float(int(fields["VmRSS"].split()[0]) * 1024)
        return rss, max(rss, float(int(fields["VmHWM"].split()[0]) * 1024))
    except (OSError, KeyError, ValueError, IndexError):
        peak = float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        return math.nan, peak * (1.0 if sys.platform == "darwin" else 1024.0)  # macOS counts bytes, Linux KiB
