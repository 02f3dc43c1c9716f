"""The process memory a watched step records."""

from __future__ import annotations

import math

import torch
from torch import nn

from inspector import read_run, watch


def _one_step(path) -> float:
    """The ``rss`` a watch records for one training step of a small model."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, optimizer, path):
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    [rss] = read_run(path).steps["rss"].tolist()
    return float(rss)


def test_rss_is_the_current_value_and_unknown_where_only_the_peak_can_be_read(monkeypatch, tmp_path):
    import builtins

    block = bytearray(256 << 20)  # touched and freed: the peak is now at least 256 MiB over the current value
    del block
    rss = _one_step(tmp_path / "run.inspect")
    with open("/proc/self/status") as fh:
        fields = dict(line.split(":", 1) for line in fh if ":" in line)
    now, peak = int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024
    # the current value, read a moment apart (the kernel updates VmHWM lazily: it can lag a reading)
    assert abs(rss - now) <= 64 << 20 and peak - rss >= 128 << 20
    real_open = builtins.open

    def no_proc(path, *args, **kwargs):  # a system without /proc, as macOS
        if str(path).startswith("/proc/"):
            raise OSError("no /proc here")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", no_proc)
    # getrusage tells only the peak: not recorded as the current value
    assert math.isnan(_one_step(tmp_path / "again.inspect"))
