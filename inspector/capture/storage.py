"""Where the copies go: a plain clone on the same device, pinned CPU memory from a GPU.

Each copy is its own tensor: no memory is held once the captures that use it are gone.
From a CUDA tensor to the CPU the copy runs on a side stream into pinned memory, so it
overlaps the forward pass; the one synchronisation is at the end of the capture.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np
import torch

MEMCPY_BYTES = 1 << 18
"""Below this size torch copies on one thread anyway, and ``clone()`` is cheaper than a memcpy."""

IN_FLIGHT_BYTES = 1 << 30
"""GPU clones waiting for their copy to the host, at most (read at every copy)."""


def memcpy(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Copy the bytes of a contiguous CPU tensor with one plain memcpy; False if it can't.

    torch's ``copy_`` splits a large CPU copy over its thread pool, which costs several times
    more CPU time than one memcpy when the cores are busy (as they are during a forward pass).
    """
    if not src.is_contiguous() or src.is_conj() or src.is_neg() or src.numel() == 0:
        return False
    try:
        np.copyto(dst.view(-1).view(torch.uint8).numpy(), src.reshape(-1).view(torch.uint8).numpy())
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


class Storage:
    """Makes the copies of one capture and knows which devices they came from."""

    def __init__(self, store_on: torch.device) -> None:
        self.store_on = store_on
        self.to_cpu = store_on.type == "cpu"
        self.sources: set[torch.device] = set()
        self.copy_streams: dict[torch.device, Any] = {}
        self.in_flight: deque[tuple[Any, int, Any]] = deque()   # (copy done event, bytes, compute stream)
        self.in_flight_bytes = 0

    def copy(self, t: torch.Tensor) -> torch.Tensor | None:
        """One copy of ``t`` where the captures are kept (None for a meta tensor, which has no
        values); call it outside inference mode, so the copy is a plain tensor."""
        if t.is_meta:
            return None
        src = t.detach()
        device = src.device
        if device not in self.sources:
            self.sources.add(device)
        plain = type(src) is torch.Tensor and src.layout == torch.strided and not src.is_quantized
        if self.to_cpu and plain:
            if device.type == "cpu":
                if src.numel() * src.element_size() >= MEMCPY_BYTES:
                    dst = torch.empty(src.shape, dtype=src.dtype)
                    if memcpy(dst, src):
                        return dst
                return src.clone(memory_format=torch.contiguous_format)
            if device.type == "cuda":
                return self._to_host(src)
            return src.to("cpu", copy=True)
        if device == self.store_on:
            return src.clone()
        return src.to(self.store_on, copy=True, non_blocking=device.type == "cuda")

    def _to_host(self, src: torch.Tensor) -> torch.Tensor:
        """Copy a CUDA tensor into pinned CPU memory on a side stream, overlapping the forward.

        A private clone is taken on the compute stream first (device-to-device, cheap), so a later
        in-place write to the live tensor can never race with the copy; the copy stream waits for
        that clone, and the allocator does not reuse the clone's memory before the copy is done
        (``record_stream``). At most ``IN_FLIGHT_BYTES`` of clones wait at a time: beyond that the
        compute stream waits for the oldest copy (a stream wait; the CPU never blocks). The only
        synchronisation is at the end of the capture (:meth:`finish`).
        """
        device = src.device
        side = self.copy_streams.get(device)
        if side is None:
            side = self.copy_streams[device] = torch.cuda.Stream(device)
        compute = torch.cuda.current_stream(device)
        private = src.clone(memory_format=torch.contiguous_format)
        side.wait_stream(compute)
        dst = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        with torch.cuda.stream(side):
            dst.copy_(private, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        private.record_stream(side)
        nbytes = private.numel() * private.element_size()
        self.in_flight.append((done, nbytes, compute))
        self.in_flight_bytes += nbytes
        while self.in_flight_bytes > IN_FLIGHT_BYTES and len(self.in_flight) > 1:
            event, n, stream = self.in_flight.popleft()
            stream.wait_event(event)
            self.in_flight_bytes -= n
        return dst

    def finish(self) -> None:
        """Wait for every copy (the one synchronisation of a capture)."""
        for dev in self.sources | {self.store_on}:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        self.in_flight.clear()
        self.in_flight_bytes = 0

