"""The (low, high) of every tensor a step's tracer checks, kept on the device in buffers that live from
step to step; one ``isfinite`` over them gives the step's flags."""

from __future__ import annotations

import torch

from ..utils.dtensors import is_dtensor

_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _piece(t: torch.Tensor) -> torch.Tensor:
    """``t`` without autograd, and for a DTensor this rank's local piece (no collective in a hook)."""
    if type(t) not in _PLAIN and is_dtensor(t):
        t = t.to_local()
    return t.detach() if t.requires_grad else t


class Stats:
    """``(low, high)`` of each tensor, written by ``torch.aminmax(..., out=...)`` into one buffer per
    (device, dtype), kept from step to step: no tensor made per flag and no stack at the end."""

    def __init__(self) -> None:
        self.keys: dict[tuple[torch.device, torch.dtype], int] = {}
        self.buffers: list[torch.Tensor] = []
        self.views: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        self.used: list[int] = []
        self.recent: dict[torch.dtype, int] = {}  # dtype -> the buffer last written for it (tried first)

    def key(self, device: torch.device, dtype: torch.dtype) -> int:
        """The index of the buffer for ``dtype`` on ``device`` (made empty the first time)."""
        k = self.keys.get((device, dtype))
        if k is None:
            k = self.keys[(device, dtype)] = len(self.buffers)
            with torch.inference_mode(False):
                self.buffers.append(torch.empty(0, dtype=dtype, device=device))
            self.views.append([])
            self.used.append(0)
        return k

    def reserve(self, device: torch.device, dtype: torch.dtype, size: int) -> None:
        """Room for ``size`` tensors of ``dtype`` on ``device`` (made when the watch opens, not in a step)."""
        k = self.recent[dtype] = self.key(device, dtype)
        if len(self.views[k]) < size:
            self.grow(k, size)

    def write(self, t: torch.Tensor) -> int:
        """Write the (low, high) of ``t`` into the buffer of its device and dtype (``t`` requires no grad,
        or grad mode is off); that buffer's key. The buffer last written for ``t``'s dtype is tried
        first, without looking its device up (a tensor on another device makes ``aminmax`` raise)."""
        if type(t) not in _PLAIN:
            t = _piece(t)
        k = self.recent.get(t.dtype)
        if k is not None:
            n = self.used[k]
            views = self.views[k]
            if n < len(views):
                try:
                    torch.aminmax(t, out=views[n])
                except RuntimeError:  # another device: looked up below
                    pass
                else:
                    self.used[k] = n + 1
                    return k
        k = self.recent[t.dtype] = self.key(t.device, t.dtype)
        n = self.used[k]
        if n == len(self.views[k]):
            self.grow(k, max(64, 2 * n))
        torch.aminmax(t, out=self.views[k][n])
        self.used[k] = n + 1
        return k

    def grow(self, k: int, size: int) -> None:
        """Room for ``size`` tensors in buffer ``k``, keeping what it holds."""
        old = self.buffers[k]
        with torch.inference_mode(False), torch.no_grad():  # ordinary tensors, even in inference mode
            new = torch.empty(2 * size, dtype=old.dtype, device=old.device)
            new[:old.numel()].copy_(old)
            self.views[k] = [(new[2 * i], new[2 * i + 1]) for i in range(size)]
        self.buffers[k] = new

    def flags(self) -> torch.Tensor | None:
        """One bool per tensor written since :meth:`reset` (True: NaN/Inf), key after key, on the
        first buffer's device."""
        parts = [torch.isfinite(b[:2 * n]).view(-1, 2).all(1).logical_not()
                 for b, n in zip(self.buffers, self.used, strict=True) if n]
        if not parts:
            return None
        device = parts[0].device
        return torch.cat([p.to(device) for p in parts]) if len(parts) > 1 else parts[0]

    def reset(self) -> None:
        self.used = [0] * len(self.used)


__all__ = ["Stats"]
