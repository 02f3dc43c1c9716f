"""``parameters_to_vector`` then ``vector_to_parameters``, step by step, on copies of a model's parameters."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from ..inventory import storage_key, tensor_inventory
from ..utils.checks import require_module
from ..utils.findings import InspectorError
from ..utils.locks import model_lock


@dataclass(frozen=True)
class RoundTrip:
    """``parameters_to_vector`` then ``vector_to_parameters`` on a copy, step by step."""

    parameters: int
    vector_numel: int
    vector_dtype: str
    shares_memory: bool          # does the vector overlap any parameter's memory? (it copies: no)
    write_through: bool          # did writing into the vector change a parameter? (no)
    restored_exactly: bool       # after vector_to_parameters, is every value bit-identical?
    dtype_changed: tuple[str, ...]   # parameters whose dtype vector_to_parameters changed
    views_after: bool            # after vector_to_parameters, are the parameters views of the vector?
    original_untouched: bool     # the model itself was not changed
    error: str | None = None     # what parameters_to_vector raised, if it did
    steps: tuple[str, ...] = ()


def _shares_storage(vec: torch.Tensor, tensors: Iterable[torch.Tensor]) -> bool:
    """Whether any of ``tensors`` lies in ``vec``'s storage (empty tensors hold no memory)."""
    key = storage_key(vec)
    return key is not None and any(storage_key(t) == key for t in tensors)


def flatten_roundtrip(model: nn.Module, max_elements: int = 20_000_000) -> RoundTrip:
    """Show, on copies of the parameters, that ``parameters_to_vector`` copies and that
    ``vector_to_parameters`` restores exactly (by making the parameters views of the vector).

    Args:
        model: read under its lock; never changed.
        max_elements: refuse larger models (the demonstration holds two extra copies).

    Raises:
        InspectorError: the model is on the meta device or larger than ``max_elements``.

    >>> rt = flatten_roundtrip(nn.Linear(3, 2))
    >>> rt.shares_memory, rt.write_through, rt.restored_exactly, rt.views_after
    (False, False, True, True)
    """
    inner = require_module(model, "flatten_roundtrip")
    with model_lock(model):
        named, _ = tensor_inventory(inner, include_buffers=False).named_unique()
        originals = [p for _, p in named]
        before, copies = _copies(originals, max_elements)
    total = sum(p.numel() for p in originals)
    steps = [f"copied the {len(copies)} tensors that parameters() yields ({total:,} elements)"]
    try:
        with torch.no_grad():
            vec = parameters_to_vector(copies)
    except RuntimeError as exc:
        msg = str(exc).splitlines()[0]
        steps.append(f"parameters_to_vector raised: {msg}")
        return RoundTrip(len(copies), 0, "", False, False, False, (), False,
                         _untouched(originals, before), msg, tuple(steps))
    shares = _shares_storage(vec, copies)
    steps.append(
        f"vec = parameters_to_vector(params): {vec.numel():,} elements of "
        f"{str(vec.dtype).removeprefix('torch.')}; it "
        f"{'shares' if shares else 'shares no'} memory with the parameters"
    )
    write_through = _writes_through(vec, copies, steps)
    dtypes_before = [p.dtype for p in copies]
    with torch.no_grad():
        for c in copies:  # scribble over the copies so that restoring is really tested
            c.data = (
                torch.full_like(c.data, float("nan")) if c.is_floating_point() else torch.zeros_like(c.data)
            )
        vector_to_parameters(vec, copies)
    changed = tuple(n for (n, _), c, d in zip(named, copies, dtypes_before, strict=True) if c.dtype != d)
    exact = all(torch.equal(c.detach().to(b.dtype), b) for c, b in zip(copies, before, strict=True))
    views = _shares_storage(vec, copies[:1])
    steps.append("vector_to_parameters(vec, params) after overwriting them with NaN: values "
                 + ("restored exactly (torch.equal on every tensor)" if exact else "NOT restored exactly"))
    if changed:
        steps.append(
            f"it changed the dtype of {len(changed)} parameters to {vec.dtype} (first: {changed[0]})"
        )
    steps.append("the parameters are now views into vec (param.data = vec[a:b].view_as(param)): writing "
                 "vec now changes them" if views else "the parameters do not share memory with vec")
    untouched = _untouched(originals, before)
    steps.append("the model's own parameters were not touched" if untouched else
                 "the model's own parameters changed while this ran")
    return RoundTrip(len(copies), vec.numel(), str(vec.dtype).removeprefix("torch."), shares, write_through,
                     exact, changed, views, untouched, None, tuple(steps))


def _copies(
    originals: list[torch.Tensor], max_elements: int
) -> tuple[list[torch.Tensor], list[nn.Parameter]]:
    """A plain copy of every parameter (to compare against) and a Parameter copy (to work on)."""
    total = sum(p.numel() for p in originals)
    if any(p.device.type == "meta" for p in originals):
        raise InspectorError("the model is on the meta device: its parameters hold no numbers, "
                             "so there is no vector to build. Load it with weights to see the round trip.")
    if total > max_elements:
        raise InspectorError(f"the round trip holds two extra copies of the {total:,} parameter "
                             f"elements; that is over the limit of {max_elements:,}. Pick a smaller model "
                             "or raise max_elements.")
    with torch.no_grad():
        before = [p.detach().clone() for p in originals]
        copies = [nn.Parameter(p.detach().clone(), requires_grad=p.requires_grad) for p in originals]
    return before, copies


def _writes_through(vec: torch.Tensor, copies: list[nn.Parameter], steps: list[str]) -> bool:
    """Does ``vec[0] += 1`` change the first parameter? (``vec`` is put back as it was.)"""
    if not vec.numel():
        return False
    with torch.no_grad():
        first = copies[0].detach().reshape(-1)
        probe = first[0].clone()
        vec[0] += 1
        write_through = not torch.equal(first[0], probe)
        vec[0] = probe.to(vec.dtype)
    steps.append("vec[0] += 1 changed the first parameter: the vector aliases it" if write_through
                 else "vec[0] += 1 left the first parameter unchanged: the vector is a copy")
    return write_through


def _untouched(originals: list[torch.Tensor], before: list[torch.Tensor]) -> bool:
    with torch.no_grad():
        return all(torch.equal(p.detach(), b) for p, b in zip(originals, before, strict=True))
