"""Start N gloo ranks for a test, each a fresh interpreter.

Ranks are spawned, never forked: by the time a distributed test runs, the pytest process holds
threads (a browser driver's event loop, tqdm's monitor) whose locks a forked child would inherit
held, and such a child can hang for good. Each worker gets ``(rank, world, port, *args)``;
``init(rank, world, port)`` joins the group with a collective timeout, so a rank that waits for a
partner that died fails in two minutes instead of holding the suite.
"""

from __future__ import annotations

import datetime
import socket
import sys
import types
from collections.abc import Callable

COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=120)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init(rank: int, world: int, port: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=COLLECTIVE_TIMEOUT)


def spawn_ranks(worker: Callable, world: int, *args, port: int | None = None) -> int:
    """Run ``worker(rank, world, port, *args)`` on ``world`` spawned processes; returns the port."""
    import torch.multiprocessing as mp

    port = free_port() if port is None else port
    # A spawned rank re-runs the parent's ``__main__`` unless it is a bare module; after an
    # AppTest that would be a page script left behind by streamlit.
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        mp.start_processes(worker, args=(world, port, *args), nprocs=world, join=True, start_method="spawn")
    finally:
        sys.modules["__main__"] = main
    return port
