"""One rank's numbers at one ``check_step`` call, as columns: one row per tensor, no Python per
tensor beyond collecting the gradients (and where something is not finite)."""

from __future__ import annotations

import operator
from collections.abc import Sequence
from itertools import repeat

import torch

from ..runfiles.record import PER_TENSOR
from ..utils.dtensors import holders
from ..utils.norms import grouped_norms
from . import digest
from .plan import Plan

GradNorms = tuple[Sequence[str], torch.Tensor]
_GRAD = operator.attrgetter("grad")


def local_numbers(plan: Plan, call: int, with_hashes: bool, grad_norms: GradNorms | None = None,
                  grads: Sequence[torch.Tensor | None] | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-tensor stats (an (n, ``PER_TENSOR``) float64 tensor), hashes ((n, 2) int64, with the
    part read) and how many ranks hold each gradient element ((n,) float64). ``grads``: the ``.grad``
    of each parameter ``grad_norms`` names, in that order, as the caller just read them (not read
    again when those names are every parameter of the plan)."""
    n = len(plan.tensors)
    pieces = plan.pieces if plan.pieces is not None else [
        t._local_tensor if dt else t  # type: ignore[attr-defined]
        for (_, _, t), dt in zip(plan.tensors, plan.dtensor, strict=True)]
    flats = plan.local_flats(pieces)
    stats = torch.zeros(n, PER_TENSOR, dtype=torch.float64)
    stats[:, 3] = plan.local_numel
    stats[:, 5] = plan.columns["keys"]
    factors = plan.columns["holders"]
    taken = plan.taken(tuple(grad_norms[0])) if grads is not None and grad_norms is not None else None
    # in plan order (made the local pieces below)
    own: list[torch.Tensor | None] = (list(taken(grads)) if taken is not None and grads is not None
                                      else list(map(_GRAD, plan.param_tensors)))
    for k in plan.dtensor_params:
        g = own[k]
        if g is None:
            continue
        t = plan.param_tensors[k]
        if g.placements != t.placements:  # type: ignore[attr-defined]
            factors = factors.clone() if factors is plan.columns["holders"] else factors
            factors[plan.param_index[k]] = holders(g, plan.world)
        own[k] = g._local_tensor  # type: ignore[attr-defined]
    stats[plan.columns["param_index"], 4] = torch.tensor(list(map(operator.is_not, own, repeat(None))),
                                                         dtype=torch.float64)
    _grad_squares(plan, own, stats, grad_norms)
    reads = plan.read(call)
    if bool(stats[:, 1:3].any()):  # non-finite gradients: read every value, to name where it started
        index = [i for i, f in enumerate(flats) if f is not None]
        checked = digest.float_groups(index, [flats[i] for i in index])  # type: ignore[misc]
    else:
        checked = [group for r in reads for group in r.checked]
    stats[:, 6:8] = digest.nonfinite_columns(checked, n)
    hash_tensor = torch.zeros(n, 2, dtype=torch.int64)
    if with_hashes:
        for r in reads:
            for device, idx, prepared, m in r.hashed:  # one device-to-host copy per device
                hash_tensor[idx, 0] = digest.run(prepared, m, device).cpu()
                hash_tensor[idx, 1] = r.part
    return stats, hash_tensor, factors


def _grad_squares(plan: Plan, grads: list[torch.Tensor | None], stats: torch.Tensor,
                  grad_norms: GradNorms | None) -> None:
    """Local squared gradient norms into ``stats[:, 0]`` (``grads``: the parameters' local gradient
    pieces, in plan order): from ``grad_norms`` where given, else one fused pass per device and
    dtype; NaN/Inf counts where not finite."""
    covered: set[int] = set()
    if grad_norms is not None:
        names, norms = grad_norms
        plan_index, name_index, covered = plan.position(tuple(names))
        stats[plan_index, 0] = norms.detach().to("cpu", torch.float64)[name_index].square()
        stats[:, 0] = torch.where(stats[:, 4] > 0, stats[:, 0], 0.0)  # a norm given for no gradient
    measured = [g if g is not None and i not in covered and g.layout == torch.strided and g.numel() else None
                for i, g in zip(plan.param_index, grads, strict=True)]
    for ks, norms in grouped_norms(measured):
        values = norms.to("cpu", torch.float64)
        stats[torch.tensor([plan.param_index[k] for k in ks], dtype=torch.long), 0] = values.square()
    bad = torch.nonzero(~torch.isfinite(stats[:, 0])).flatten().tolist()
    if not bad:
        return
    position = {i: k for k, i in enumerate(plan.param_index)}
    for i in bad:
        g = grads[position[i]] if i in position else None
        if g is None or g.layout != torch.strided:
            continue
        stats[i, 1] = int(torch.isnan(g).sum())
        stats[i, 2] = int(torch.isinf(g).sum())
        if stats[i, 1] == 0 and stats[i, 2] == 0:  # finite values whose norm overflowed
            stats[i, 0] = float(torch.linalg.vector_norm(g.double())) ** 2
