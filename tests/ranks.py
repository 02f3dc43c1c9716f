"""Start N gloo ranks for a test, each a fresh interpreter.

Ranks are spawned, never forked: by the time a distributed test runs, the pytest process holds
threads (a browser driver's event loop, tqdm's monitor) whose locks a forked child would inherit
held, and such a child can hang for good. Each worker gets ``(rank, world, port, *args)``;
``init(rank, world, port)`` joins the group with a collective timeout, so a rank that waits for a
partner that died fails in two minutes instead of holding the suite.
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import signal
import socket
import sys
import time
import types
from collections.abc import Callable

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)
SPAWN_TIMEOUT = 300.0  # the slowest world (4 ranks, FSDP2 x TP) takes about 60 s on a loaded machine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=COLLECTIVE_TIMEOUT)


def leave() -> None:
    """End this rank's group in the project's order (called in ``finally``): after an error, without
    waiting for the other ranks."""
    from inspector.distributed import end_group

    end_group(wait=sys.exc_info()[1] is None)


def spawn_ranks(worker: Callable, world: int, *args, port: int | None = None,
                timeout: float = SPAWN_TIMEOUT) -> int:
    """Run ``worker(rank, world, port, *args)`` on ``world`` spawned processes; returns the port.

    Ranks still running after ``timeout`` seconds print every thread's stack (faulthandler, on
    SIGABRT) and are killed, and the test fails naming them.
    """
    import torch.multiprocessing as mp

    port = free_port() if port is None else port
    # A spawned rank re-runs the parent's ``__main__`` unless it is a bare module; after an
    # AppTest that would be a page script left behind by streamlit.
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        context = mp.start_processes(_with_stack_dumps, args=(worker, world, port, *args), nprocs=world,
                                     join=False, start_method="spawn")
    finally:
        sys.modules["__main__"] = main
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            stuck = [p.pid for p in context.processes if p.is_alive()]
            for p in context.processes:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGABRT)
            time.sleep(2)
            for p in context.processes:
                if p.is_alive():
                    p.kill()
            raise AssertionError(f"ranks {stuck} were still running after {timeout:.0f} s; their stacks are "
                                 "printed above")
    return port


def _with_stack_dumps(rank: int, worker: Callable, *args) -> None:
    faulthandler.enable(all_threads=True)  # SIGABRT from spawn_ranks prints every thread's stack
    worker(rank, *args)
