"""L2 norms of many tensors at once: one ``torch._foreach_norm`` per (device, dtype) group.

The one place the watch, the gradient pass, ``check_step``'s local numbers and its digest group
tensors for a fused norm.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def grouped_norms(tensors: Sequence[torch.Tensor | None]) -> list[tuple[list[int], torch.Tensor]]:
    """The L2 norm of each tensor, fused per (device, dtype): ``(positions, norms)`` pairs, ``norms`` a
    1-d tensor on the group's device in its dtype, in the order of ``positions`` (indices into
    ``tensors``), groups in the order first seen. None entries are left out (pass None for what a
    caller leaves out: empty, sparse or integer tensors); nothing is synchronised and no graph is built.

    >>> [(i, n.tolist()) for i, n in grouped_norms([torch.tensor([3.0, 4.0]), None,
    ...                                             torch.tensor([1.0], dtype=torch.float64)])]
    [([0], [5.0]), ([2], [1.0])]
    """
    groups: dict[tuple[torch.device, torch.dtype], tuple[list[int], list[torch.Tensor]]] = {}
    for i, t in enumerate(tensors):
        if t is not None:
            idx, members = groups.setdefault((t.device, t.dtype), ([], []))
            idx.append(i)
            members.append(t)
    out = []
    for idx, members in groups.values():
        with torch.no_grad():
            try:
                norms: list[torch.Tensor] | tuple[torch.Tensor, ...] = torch._foreach_norm(members)
            except (RuntimeError, NotImplementedError):  # pragma: no cover - kernels missing on a backend
                norms = [torch.linalg.vector_norm(t) for t in members]
        out.append((idx, torch.stack(list(norms))))
    return out
