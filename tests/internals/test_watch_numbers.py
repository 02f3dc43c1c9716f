"""The process memory a watched step records."""

from __future__ import annotations

import math


def test_rss_is_the_current_value_and_unknown_where_only_the_peak_can_be_read(monkeypatch):
    import builtins

    from inspector.watching.numbers import memory

    rss = memory(None)[2]
    with open("/proc/self/status") as fh:
        fields = dict(line.split(":", 1) for line in fh if ":" in line)
    now, peak = int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
    assert abs(rss - now) <= 64 << 20 and rss <= peak  # the current value, read twice a moment apart
    real_open = builtins.open

    def no_proc(path, *args, **kwargs):  # a system without /proc, as macOS
        if str(path).startswith("/proc/"):
            raise OSError("no /proc here")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc)
    assert math.isnan(memory(None)[2])  # getrusage tells only the peak: not reported as the current value
