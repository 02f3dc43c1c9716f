"""Where each parameter sits in the flat vector, and which parameter a flat index falls in.

``torch.nn.utils.parameters_to_vector(model.parameters())`` concatenates every
Parameter object once, in registration order, frozen ones included. This module
gives the offsets of that vector from metadata alone (it works on the meta device
and never allocates the vector), finds the parameter behind a flat index, and says
what stops ``parameters_to_vector`` from working as people expect.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from torch import nn

from ..inventory import tensor_inventory
from ..utils.checks import require_module
from ..utils.dtensors import has_dtensors
from ..utils.findings import Finding, InspectorError
from ._tables import OFFSET_COLUMNS, frame, label

# --------------------------------------------------------------------------- offset map


def offset_map(model: nn.Module, trainable_only: bool = False,
               include_buffers: bool = False) -> pd.DataFrame:
    """One row per tensor of the flat vector, in ``parameters()`` order.

    ``parameters_to_vector(<the rows' tensors>)[start:end]`` equals each tensor flattened.
    Built from metadata only: no vector is allocated, and meta tensors work.

    Args:
        model: the model; not changed.
        trainable_only: offsets of a vector of the parameters with ``requires_grad`` only.
            Every parameter after the first frozen one then has a different offset.
        include_buffers: add buffer rows after the parameters (``kind == "buffer"``); they
            never shift a parameter's offset.

    Returns:
        Columns ``name, aliases, module, start, end, numel, shape, dtype, device,
        requires_grad, kind``. ``aliases`` is a tuple of the other names of the same
        object (a tied tensor appears once, under its first name); ``module`` is the name of
        the module that holds ``name`` ("" for the model itself).

    >>> m = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 3, bias=False))
    >>> _ = m[0].bias.requires_grad_(False)
    >>> offset_map(m)[["name", "start", "end"]].values.tolist()
    [['0.weight', 0, 6], ['0.bias', 6, 9], ['1.weight', 9, 18]]
    >>> offset_map(m, trainable_only=True)["start"].tolist()
    [0, 6]
    """
    model = require_module(model, "offset_map")
    inventory = tensor_inventory(model, include_buffers)
    params, shared = inventory.named_unique()
    entries = [(name, p, "parameter", p.requires_grad) for name, p in params
               if not trainable_only or p.requires_grad]
    if include_buffers:
        buffers, shared_buffers = inventory.named_unique("buffer")
        shared.update(shared_buffers)
        entries += [(name, b, "buffer", False) for name, b in buffers]
    dtype_names: dict[torch.dtype, str] = {}
    device_names: dict[torch.device, str] = {}
    rows = []
    offset = 0
    for name, t, kind, requires_grad in entries:
        n = t.numel()
        dt = t.dtype
        dt_name = dtype_names.get(dt) or label(dtype_names, dt)
        dev = t.device
        dev_name = device_names.get(dev) or label(device_names, dev)
        names = shared.get(id(t))
        rows.append((name, tuple(names[1:]) if names else (), name.rpartition(".")[0], offset, offset + n, n,
                     tuple(t.shape), dt_name, dev_name, requires_grad, kind))
        offset += n
    table = frame(OFFSET_COLUMNS, rows)
    tensors = [t for _, t, _, _ in entries]
    if has_dtensors(tensors):  # FSDP2 / tensor parallel: add this rank's pieces
        from ..sharding import with_local_offsets
        table = with_local_offsets(table, tensors)
    return table


def offset_findings(model: nn.Module, trainable_only: bool = False) -> list[Finding]:
    """What stops ``parameters_to_vector`` from working as people expect, for ``model``.

    Codes: ``non-contiguous`` (``view(-1)`` fails), ``mixed-dtypes`` (the vector is
    promoted and ``vector_to_parameters`` changes dtypes), ``several-devices`` (refused),
    ``frozen-shift`` (a trainable-only vector has different offsets), ``tied`` (an alias
    appears once), ``meta`` (structure only).

    >>> m = nn.Linear(3, 2)
    >>> m.weight = nn.Parameter(torch.zeros(3, 2).t())
    >>> [f.code for f in offset_findings(m)]
    ['non-contiguous']
    """
    model = require_module(model, "offset_findings")
    all_params, shared = tensor_inventory(model, include_buffers=False).named_unique()
    params = [(n, p) for n, p in all_params if p.requires_grad] if trainable_only else all_params
    out = _contiguity_findings(params) + _mixing_findings(params) + _frozen_shift_findings(all_params)
    for name, p in params:
        names = shared.get(id(p))
        if names:
            out.append(Finding(
                "tied", "info", name,
                f"{name} is also reachable as {', '.join(names[1:])}: it is one Parameter object, so it "
                f"appears once in the flat vector ({p.numel()} elements, not {p.numel() * len(names)})."))
    if any(p.device.type == "meta" for _, p in params):
        out.append(Finding(
            "meta", "info", "",
            "the model is on the meta device: offsets come from shapes alone; there are no values, "
            "so no gradients and no flat vector."))
    return out


def _contiguity_findings(params: list[tuple[str, torch.Tensor]]) -> list[Finding]:
    """``non-contiguous``: parameters that ``view(-1)`` cannot flatten."""
    return [Finding(
        "non-contiguous", "warning", name,
        f"{name} (shape {tuple(p.shape)}, stride {tuple(p.stride())}) is not contiguous: "
        "parameters_to_vector calls view(-1) on it and raises. Flatten with "
        "torch.cat([p.reshape(-1) for p in params]) instead; the offsets shown hold for that "
        "row-major flattening.")
        for name, p in params if p.device.type != "meta" and not p.is_contiguous()]


def _mixing_findings(params: list[tuple[str, torch.Tensor]]) -> list[Finding]:
    """``mixed-dtypes`` and ``several-devices``: what one flat vector cannot hold as it is."""
    out: list[Finding] = []
    dtypes: dict[str, list[str]] = {}
    devices: dict[str, list[str]] = {}
    for name, p in params:
        dtypes.setdefault(str(p.dtype).removeprefix("torch."), []).append(name)
        devices.setdefault(str(p.device), []).append(name)
    if len(dtypes) > 1:
        promoted = str(torch.cat([torch.empty(0, dtype=getattr(torch, d)) for d in dtypes]).dtype)
        promoted = promoted.removeprefix("torch.")
        parts = ", ".join(f"{d} ({len(n)}, first {n[0]})" for d, n in dtypes.items())
        out.append(Finding(
            "mixed-dtypes", "warning", "",
            f"parameters have several dtypes: {parts}. parameters_to_vector promotes them all to "
            f"{promoted}, and vector_to_parameters then gives every parameter {promoted} data, "
            "silently changing the dtype of the others. Flatten each dtype group separately."))
    if len(devices) > 1:
        parts = ", ".join(f"{d} ({len(n)}, first {n[0]})" for d, n in devices.items())
        out.append(Finding(
            "several-devices", "warning", "",
            f"parameters are on several devices: {parts}. parameters_to_vector refuses them "
            "('Found two parameters on different devices'); flatten per device."))
    return out


def _frozen_shift_findings(all_params: list[tuple[str, torch.Tensor]]) -> list[Finding]:
    """``frozen-shift``: frozen parameters before trainable ones move the trainable-only offsets."""
    frozen = [(i, n) for i, (n, p) in enumerate(all_params) if not p.requires_grad]
    if not frozen or len(frozen) == len(all_params):
        return []
    first_i, first_name = frozen[0]
    shifted = [n for n, p in all_params[first_i + 1:] if p.requires_grad]
    if not shifted:
        return []
    return [Finding(
        "frozen-shift", "info", first_name,
        f"{len(frozen)} frozen parameters sit among trainable ones (first: {first_name}). "
        "parameters() still yields them, so parameters_to_vector(model.parameters()) "
        "includes them; a vector of trainable parameters only has different offsets for "
        f"{len(shifted)} trainable parameters after it (first: {shifted[0]}).")]


# --------------------------------------------------------------------------- locate


@dataclass(frozen=True)
class Location:
    """Where a flat index falls: which tensor, and which element of it."""

    index: int
    name: str
    aliases: tuple[str, ...]
    start: int
    end: int
    offset: int                 # index - start: position in the flattened tensor
    element: tuple[int, ...]    # the multi-dimensional index, row-major
    shape: tuple[int, ...]
    dtype: str
    device: str
    requires_grad: bool
    kind: str
    total: int                  # length of the vector

    def describe(self) -> str:
        idx = ", ".join(str(i) for i in self.element)
        alias = f" (also {', '.join(self.aliases)})" if self.aliases else ""
        return (f"element {self.index:,} of the {self.total:,}-element vector is {self.name}[{idx}]"
                f"{alias}: element {self.offset:,} of its {self.end - self.start:,} "
                f"(range {self.start:,}..{self.end - 1:,}, shape {tuple(self.shape)})")


def locate(model: nn.Module | pd.DataFrame, index: int, trainable_only: bool = False) -> Location:
    """Which parameter, and which element of it, flat ``index`` falls in.

    Args:
        model: the model, or a table from :func:`offset_map` (then ``trainable_only`` is
            already decided by how that table was made).
        index: a position in ``parameters_to_vector(model.parameters())`` (or in the
            trainable-only vector).
        trainable_only: index into a vector of trainable parameters only.

    Raises:
        InspectorError: the index is negative, not an integer, or past the end.

    >>> m = nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 3, bias=False))
    >>> loc = locate(m, 10)
    >>> loc.name, loc.element
    ('1.weight', (0, 1))
    """
    table = model if isinstance(model, pd.DataFrame) else offset_map(model, trainable_only=trainable_only)
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
        raise InspectorError(f"a flat index must be an integer, got {index!r}")
    index = int(index)
    params = table[table["kind"] == "parameter"] if "kind" in table else table
    total = int(params["end"].iloc[-1]) if len(params) else 0
    what = "trainable-only vector" if trainable_only else "flat vector"
    if total == 0:
        raise InspectorError(f"the {what} is empty: the model has no parameters"
                             + (" that require gradients" if trainable_only else ""))
    if index < 0 or index >= total:
        raise InspectorError(f"index {index} is out of range: the {what} has {total} elements, "
                             f"so valid indices are 0..{total - 1}")
    starts = params["start"].to_numpy()
    i = bisect.bisect_right(starts.tolist(), index) - 1
    # zero-element tensors share a start with the next one; take the one that holds the index
    while int(params["end"].iloc[i]) <= index:
        i += 1
    row = params.iloc[i]
    shape = tuple(int(s) for s in row["shape"])
    offset = index - int(row["start"])
    element = tuple(int(e) for e in np.unravel_index(offset, shape)) if shape else ()
    return Location(index, str(row["name"]), tuple(row["aliases"]), int(row["start"]), int(row["end"]),
                    offset, element, shape, str(row["dtype"]), str(row["device"]),
                    bool(row["requires_grad"]), str(row["kind"]), total)


def display_table(table: pd.DataFrame) -> pd.DataFrame:
    """The offset map with tuples written out (``aliases`` and ``shape`` as text), for showing.

    >>> display_table(offset_map(nn.Linear(2, 1)))["shape"].tolist()
    ['(1, 2)', '(1,)']
    """
    out = table.copy()
    if "aliases" in out:
        out["aliases"] = [", ".join(a) for a in out["aliases"]]
    if "shape" in out:
        out["shape"] = [str(tuple(s)) for s in out["shape"]]
    return out


def vector_lengths(full: pd.DataFrame, trainable: pd.DataFrame) -> dict[str, int]:
    """Lengths of both flat vectors from :func:`offset_map` frames (all, and ``trainable_only``).

    ``total``: parameter elements in ``parameters_to_vector(model.parameters())``; ``trainable``:
    elements of the trainable-only vector; ``frozen``: the holes between them; ``tensors``: rows
    of ``parameters()``; ``aliases``: names kept once because they share a parameter.
    """
    params = full[full["kind"] == "parameter"]
    return {
        "total": int(params["numel"].sum()),
        "frozen": int(params.loc[~params["requires_grad"], "numel"].sum()),
        "trainable": int(trainable["numel"].sum()),
        "tensors": len(params),
        "aliases": int(params["aliases"].map(len).sum()),
    }
