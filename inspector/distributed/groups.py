"""Process groups made and ended in a fixed order, never left to the garbage collector.

A gloo group's C++ destructor joins the group's worker threads while its caller holds the GIL.
A collective launched during a backward pass carries the Python context autograd saved for that
pass, and the worker thread that ran it needs the GIL to let go of that context once the work is
done. If the last reference to the group goes in that moment (a DDP reducer freed with a frame
cleared on return), the join waits for the worker and the worker for the GIL: the process never
ends. So a group made here ends in this order:

1. every outstanding collective is waited for (a barrier, waited on with the GIL released);
2. the wrapper's hold on the group is dropped explicitly (:func:`release_wrapper`: DDP's reducer),
   while the group is still registered, so that drop never frees it;
3. the group is deregistered (``destroy_process_group``) while this module still holds it;
4. the GIL is let go until no gloo worker thread is left mid-work (:func:`settle`); only then is the
   last reference this module holds dropped, so whoever frees the group later finds its workers idle.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

_SETTLE_S = 0.02  # the shortest GIL-free pause: many times what a worker needs to drop a work
_SETTLE_MAX_S = 2.0
END_TIMEOUT = datetime.timedelta(seconds=60)


@contextlib.contextmanager
def process_group(device: str = "cpu") -> Iterator[tuple[int, int]]:
    """The process group torchrun describes in the environment, or a world of one.

    Yields ``(rank, world_size)``. A group that was already initialised is used and left
    alone; one made here is ended on exit by :func:`end_group`. NCCL for CUDA devices, gloo
    otherwise.
    """
    if dist.is_initialized():
        yield dist.get_rank(), dist.get_world_size()
        return
    backend = "nccl" if device.startswith("cuda") else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    failed = True
    try:
        yield dist.get_rank(), dist.get_world_size()
        failed = False
    finally:
        end_group(wait=not failed)


def release_wrapper(model: nn.Module) -> None:
    """Drop, in place, what a ``DistributedDataParallel`` wrapper holds of its process group.

    Its reducer owns a reference to the group; freed later by the garbage collector, it could be
    the last one (see the module docstring). The wrapper cannot train afterwards; the module it
    wraps (``model.module``) is untouched. Anything else is left as it is.
    """
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        for name in ("reducer", "logger", "process_group"):
            model.__dict__.pop(name, None)


def end_group(wait: bool = True, timeout: datetime.timedelta = END_TIMEOUT) -> None:
    """End the default process group in the order of the module docstring.

    ``wait``: wait for every rank's outstanding collectives first (a barrier with ``timeout``;
    skipped after an error, when another rank may be gone).
    """
    if not dist.is_initialized():
        return
    group = dist.group.WORLD  # held until the workers have settled
    if wait:
        with contextlib.suppress(Exception):  # a rank that is gone: end this one all the same
            _barrier(timeout)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    dist.destroy_process_group()
    settle()
    del group


def _barrier(timeout: datetime.timedelta) -> None:
    """A barrier queued behind every collective already issued, waited for with the GIL released."""
    work = dist.barrier(async_op=True)
    if work is not None:
        work.wait(timeout)


def settle() -> float:
    """Let go of the GIL until no gloo worker thread of this process is runnable (mid-work), at
    least :data:`_SETTLE_S` and at most :data:`_SETTLE_MAX_S`; returns the seconds waited.

    A worker that has finished a collective but not yet let go of it is runnable, or waiting for
    the GIL, which it takes during the pause. Where threads cannot be read (not Linux), the
    shortest pause.
    """
    start = time.perf_counter()
    time.sleep(_SETTLE_S)
    while _gloo_workers_running() and time.perf_counter() - start < _SETTLE_MAX_S:
        time.sleep(0.005)
    return time.perf_counter() - start


def _gloo_workers_running() -> bool:
    """Whether a gloo worker thread (``pt_gloo_runloop``) of this process is running or runnable."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue
        name, _, rest = stat.partition("(")[2].rpartition(")")
        if name == "pt_gloo_runloop" and rest.split()[:1] == ["R"]:
            return True
    return False
