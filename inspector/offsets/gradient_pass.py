"""One pass over the gradients: an L2 norm per gradient, one fused call per device and dtype.

The gradient norm tables (per parameter and per module) are built from the numbers this
module measures. It reads every gradient once, with one ``torch._foreach_norm`` per
(device, dtype) group, and copies the norms of each device to the host once.

The measuring is split in two steps so that gradients held in pieces (one shard per
process, as with ``DTensor``) can plug in without touching the tables:

* ``local`` gives, for each gradient, the plain tensor of the elements this process holds
  (the gradient itself by default);
* ``reduce``, when given, receives the squared norms of one group on its device and returns
  the squared norms of the whole tensors (for shards: a sum over the processes that hold
  the pieces). Without it the norms are taken as measured, so the numbers are exactly those
  of ``torch._foreach_norm``.

:class:`Pieces` bundles both steps with what else a sharded measurement needs (counts of
NaN and Inf per process); ``inspector.sharding.ShardedGradients`` implements it for DTensor
gradients.

Nothing is cached: every call reads the gradients as they are now (an in-place edit
through ``.data`` does not move a tensor's version counter, so no key on versions can be
trusted). ``inspector.offsets.gradient_report`` returns the per-parameter and per-module
tables from one pass.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch

from ..utils.norms import grouped_norms

LocalView = Callable[[torch.Tensor], torch.Tensor]
SquaresReducer = Callable[[torch.Tensor, Sequence[int]], torch.Tensor]


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t


class Pieces(Protocol):
    """Gradients held in pieces by several processes: how to measure them as whole tensors.

    Every process must make the same calls in the same order: ``reduce`` and
    ``gather_counts`` are collectives.
    """

    def local(self, grad: torch.Tensor) -> torch.Tensor:
        """The plain tensor of the elements this process holds."""

    def reduce(self, squares: torch.Tensor, grads: Sequence[torch.Tensor]) -> torch.Tensor:
        """Squared local norms of ``grads`` (one tensor, one entry each) -> squared norms of the whole
        gradients. Used as the ``reduce`` of :func:`gradient_l2_norms`."""

    def gather_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """This process's ``(k, 2)`` NaN/Inf counts -> ``(processes, k, 2)``, every process's counts."""


def gradient_l2_norms(grads: Sequence[torch.Tensor], local: LocalView = _plain,
                      reduce: SquaresReducer | None = None) -> np.ndarray:
    """L2 norm of each dense gradient, as float64, in the order given.

    Args:
        grads: strided tensors (any devices and dtypes).
        local: maps a gradient to the tensor of the elements this process holds.
        reduce: ``reduce(squares, indices)`` gets the squared local norms (float32, on the
            group's device) of the gradients ``grads[i] for i in indices`` and returns the
            squared norms of the whole gradients; ``None`` keeps the local norms.

    Returns:
        One norm per gradient (NaN or Inf where the gradient holds such values).

    >>> gradient_l2_norms([torch.tensor([3.0, 4.0]), torch.tensor([1.0], dtype=torch.float64)]).tolist()
    [5.0, 1.0]
    """
    out = np.zeros(len(grads), dtype=np.float64)
    if not grads:
        return out
    per_device: dict[torch.device, tuple[list[torch.Tensor], list[int]]] = {}
    for idx, norms in grouped_norms([local(g) for g in grads]):
        device = norms.device
        # float64 keeps a float64 gradient's norm exact; MPS has no float64
        values = norms.to(torch.float32 if device.type == "mps" else torch.float64)
        if reduce is not None:
            values = reduce(values * values, idx).sqrt()
        parts, order = per_device.setdefault(device, ([], []))
        parts.append(values)
        order.extend(idx)
    for parts, order in per_device.values():
        values = parts[0] if len(parts) == 1 else torch.cat(parts)
        out[order] = values.cpu().numpy()  # one host transfer per device
    return out

