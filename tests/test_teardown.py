"""Process groups end in a fixed order, never by the garbage collector, and the one-process
training commands exit promptly however often they run in one interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Browser-test-like background threads (an asyncio loop per driver, a thread busy in Python),
# then the one-process DDP and FSDP commands 30 times each, in one interpreter. A teardown that
# left a gloo group to the garbage collector hangs here within a few hundred runs of DDP alone;
# faulthandler ends a hung child and prints every thread's stack.
SCRIPT = """
import asyncio, contextlib, faulthandler, io, sys, threading, time
faulthandler.dump_traceback_later({limit}, exit=True)

def driver_loop():
    asyncio.new_event_loop().run_forever()

def busy():
    while True:
        sum(range(1000))
        time.sleep(0.001)

for target in (driver_loop, driver_loop, busy):
    threading.Thread(target=target, daemon=True).start()

from inspector.__main__ import main

out = sys.argv[1]
for i in range({runs}):
    for command in ("distributed", "watch"):
        for shard in ("ddp", "fsdp"):
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
                status = main([command, "sample_models/fsdp.py:build", "--shard", shard, "--steps", "2",
                               "-o", f"{{out}}/{{command}}-{{shard}}"])
            assert status == 0, (i, command, shard, err.getvalue()[-2000:])
print("ran", {runs})
"""


def test_one_process_ddp_and_fsdp_commands_end_30_times_in_a_row(tmp_path):
    limit = 240
    done = subprocess.run([sys.executable, "-c", SCRIPT.format(limit=limit, runs=30), str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=limit + 30,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert done.stdout.split() == ["ran", "30"]


@pytest.mark.collectives
def test_a_group_ends_in_order_with_its_workers_settled(monkeypatch):
    import torch
    import torch.distributed as dist

    from inspector.distributed import groups, process_group, sharded

    order = []
    for name in ("_barrier", "settle"):
        real = getattr(groups, name)
        monkeypatch.setattr(groups, name, lambda *a, real=real, name=name: order.append(name) or real(*a))
    destroy = dist.destroy_process_group
    monkeypatch.setattr(dist, "destroy_process_group", lambda: order.append("destroy") or destroy())

    with process_group():
        with sharded(torch.nn.Linear(3, 2), "ddp", torch.device("cpu")) as ddp:
            ddp(torch.ones(4, 3)).sum().backward()  # DDP's all-reduce runs on gloo's worker threads
            assert _gloo_workers() >= 1
        # the wrapper let go of the group while the group still exists
        assert not {"reducer", "logger", "process_group"} & set(ddp.__dict__) and dist.is_initialized()
    assert order == ["_barrier", "destroy", "settle"]
    assert not dist.is_initialized()
    assert not groups._gloo_workers_running()  # settled: no worker is mid-work
    assert ddp.module.weight.grad is not None  # the wrapped module itself is untouched


def _gloo_workers() -> int:
    """How many of this process's threads are gloo workers (Linux names them ``pt_gloo_runloop``)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            names.append(Path(f"/proc/self/task/{tid}/comm").read_text().strip())
        except OSError:
            continue
    return names.count("pt_gloo_runloop")


@pytest.mark.collectives
def test_a_group_made_for_a_failing_body_is_still_ended_without_waiting(monkeypatch):
    import torch.distributed as dist

    from inspector.distributed import groups, process_group

    monkeypatch.setattr(groups, "_barrier", lambda *a: pytest.fail("waited for ranks after an error"))
    with pytest.raises(ValueError, match="the model raised"):
        with process_group():
            raise ValueError("the model raised")
    assert not dist.is_initialized()
