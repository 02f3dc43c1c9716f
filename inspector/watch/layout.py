"""Which tensors a watch follows, grouped into their modules, and fused norms over them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from ..distributed import is_dtensor
from ..wrappers import underlying


@dataclass(frozen=True)
class Layout:
    """The trainable parameters (first names, ``named_parameters()`` order), the modules that
    own them directly (in first-use order) and each parameter's owner index; float buffers."""

    parameters: tuple[str, ...]
    modules: tuple[str, ...]
    owner: np.ndarray
    buffers: tuple[str, ...]

    @classmethod
    def of(cls, model: nn.Module) -> Layout:
        names = tuple(n for n, p in underlying(model).named_parameters() if p.requires_grad)
        modules: dict[str, int] = {}
        owner = [modules.setdefault(n.rpartition(".")[0], len(modules)) for n in names]
        buffers = tuple(n for n, b in underlying(model).named_buffers() if b.is_floating_point())
        return cls(names, tuple(modules), np.asarray(owner, dtype=np.int64), buffers)

    def per_module(self, values: np.ndarray, how: str = "norm") -> np.ndarray:
        """Per-parameter ``values`` gathered into their modules: L2 (``"norm"``) or ``"sum"``."""
        out = np.zeros(len(self.modules))
        v = np.asarray(values, dtype=np.float64)
        np.add.at(out, self.owner, v * v if how == "norm" else v)
        return np.sqrt(out) if how == "norm" else out


def current(model: nn.Module, names: tuple[str, ...], kind: str = "parameter") -> list[torch.Tensor | None]:
    """The tensors ``model`` holds under ``names`` now (None where a name is gone).

    Looked up on every call, so a parameter replaced mid-run (``load_state_dict(assign=True)``)
    is followed."""
    items = underlying(model).named_parameters() if kind == "parameter" else underlying(model).named_buffers()
    found = dict(items)
    return [found.get(n) for n in names]


def fused_norms(tensors: list[torch.Tensor | None]) -> list[tuple[np.ndarray, torch.Tensor]]:
    """L2 norms of the local pieces of ``tensors``, one ``torch._foreach_norm`` per (device, dtype).

    Returns ``(indices, norms)`` pairs: float32 norms on the device, in the order of ``indices``
    (positions in ``tensors``); None and empty tensors are left out. Nothing is synchronised.
    """
    groups: dict[tuple[torch.device, torch.dtype], tuple[list[int], list[torch.Tensor]]] = {}
    for i, t in enumerate(tensors):
        if t is None:
            continue
        piece = (t.to_local() if is_dtensor(t) else t).detach()
        if piece.numel() and piece.layout == torch.strided:
            idx, ts = groups.setdefault((piece.device, piece.dtype), ([], []))
            idx.append(i)
            ts.append(piece)
    out = []
    for idx, ts in groups.values():
        norms = torch._foreach_norm(ts)
        out.append((np.asarray(idx, dtype=np.int64), torch.stack(norms).float()))
    return out


def to_host(parts: list[torch.Tensor]) -> list[np.ndarray]:
    """``parts`` (1-d tensors) on the host, with one device-to-host copy per device."""
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(parts):
        by_device.setdefault(t.device, []).append(i)
    out: list[np.ndarray] = [np.zeros(0)] * len(parts)
    for idx in by_device.values():
        flat = torch.cat([parts[i].reshape(-1).float() for i in idx]).cpu().numpy()
        start = 0
        for i in idx:
            n = parts[i].numel()
            out[i] = flat[start:start + n]
            start += n
    return out
