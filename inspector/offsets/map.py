"""Where each parameter sits in the flat vector, and how big its gradient is.

``torch.nn.utils.parameters_to_vector(model.parameters())`` concatenates every
Parameter object once, in registration order, frozen ones included. This module
gives the offsets of that vector from metadata alone (it works on the meta device
and never allocates the vector), finds the parameter behind a flat index, and
measures gradient norms per parameter and per module in one pass.
"""

from __future__ import annotations

import bisect
import difflib
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from .checks import require_module
from .distributed.tensors import has_dtensors
from .findings import Finding, InspectorError
from .gradient_pass import Pieces, gradient_l2_norms
from .locks import model_lock

OFFSET_COLUMNS = ["name", "aliases", "module", "start", "end", "numel", "shape", "dtype",
                  "device", "requires_grad", "kind"]
PARAMETER_NORM_COLUMNS = ["name", "norm", "state", "nan", "inf", "numel", "dtype", "device",
                          "requires_grad"]
MODULE_NORM_COLUMNS = ["name", "norm", "state", "nan", "inf", "numel", "parameters", "ok", "none",
                       "frozen", "nonfinite", "depth", "owns_parameters", "own_norm"]
STATES = ("ok", "none", "frozen", "nonfinite")
ROOT = "(model)"

_INT_COLUMNS = {"start", "end", "numel", "nan", "inf", "parameters", "ok", "none", "frozen",
                "nonfinite", "depth"}


# --------------------------------------------------------------------------- offset map


def _unique_parameters(model: nn.Module) -> tuple[list[tuple[str, nn.Parameter]], dict[int, list[str]]]:
    """``named_parameters()`` order (first name wins) and every alias, from one walk.

    Walking ``remove_duplicate=False`` and keeping the first name of each object gives
    exactly the order of ``parameters()``: both visit modules in the same pre-order.
    """
    first: list[tuple[str, nn.Parameter]] = []
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        seen = names.get(id(p))
        if seen is None:
            names[id(p)] = [name]
            first.append((name, p))
        else:
            seen.append(name)
    return first, names


def _unique_buffers(model: nn.Module) -> tuple[list[tuple[str, torch.Tensor]], dict[int, list[str]]]:
    first: list[tuple[str, torch.Tensor]] = []
    names: dict[int, list[str]] = {}
    for name, b in model.named_buffers(remove_duplicate=False):
        seen = names.get(id(b))
        if seen is None:
            names[id(b)] = [name]
            first.append((name, b))
        else:
            seen.append(name)
    return first, names


def _frame(columns: list[str], rows: dict[str, list[Any]]) -> pd.DataFrame:
    data: dict[str, Any] = {}
    for col in columns:
        values = rows[col]
        if col in _INT_COLUMNS:
            data[col] = np.asarray(values, dtype=np.int64)
        elif col in ("requires_grad", "owns_parameters"):
            data[col] = np.asarray(values, dtype=bool)
        elif col in ("norm", "own_norm"):
            data[col] = np.asarray(values, dtype=np.float64)
        else:
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            data[col] = arr
    return pd.DataFrame(data, columns=columns, copy=False)


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
    params, names = _unique_parameters(model)
    entries: list[tuple[str, torch.Tensor, list[str], str, bool]] = [
        (name, p, names[id(p)], "parameter", p.requires_grad) for name, p in params
        if not trainable_only or p.requires_grad]
    if include_buffers:
        buffers, bnames = _unique_buffers(model)
        entries += [(name, b, bnames[id(b)], "buffer", False) for name, b in buffers]
    dtype_names: dict[torch.dtype, str] = {}
    device_names: dict[torch.device, str] = {}
    rows = []
    offset = 0
    for name, t, aliases, kind, requires_grad in entries:
        n = t.numel()
        dt = t.dtype
        dt_name = dtype_names.get(dt)
        if dt_name is None:
            dt_name = dtype_names[dt] = str(dt).removeprefix("torch.")
        dev = t.device
        dev_name = device_names.get(dev)
        if dev_name is None:
            dev_name = device_names[dev] = str(dev)
        rows.append((name, tuple(aliases[1:]), name.rpartition(".")[0], offset, offset + n, n,
                     tuple(t.shape), dt_name, dev_name, requires_grad, kind))
        offset += n
    columns = list(zip(*rows)) if rows else [[] for _ in OFFSET_COLUMNS]
    table = _frame(OFFSET_COLUMNS, dict(zip(OFFSET_COLUMNS, columns)))
    tensors = [t for _, t, *_ in entries]
    if has_dtensors(tensors):  # FSDP2 / tensor parallel: add this rank's pieces
        from .distributed.analyses import with_local_offsets
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
    params, names = _unique_parameters(model)
    if trainable_only:
        params = [(n, p) for n, p in params if p.requires_grad]
    out: list[Finding] = []
    for name, p in params:
        if p.device.type != "meta" and not p.is_contiguous():
            out.append(Finding(
                "non-contiguous", "warning", name,
                f"{name} (shape {tuple(p.shape)}, stride {tuple(p.stride())}) is not contiguous: "
                "parameters_to_vector calls view(-1) on it and raises. Flatten with "
                "torch.cat([p.reshape(-1) for p in params]) instead; the offsets shown hold for that "
                "row-major flattening."))
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
    all_params, _ = _unique_parameters(model)
    frozen = [(i, n, p) for i, (n, p) in enumerate(all_params) if not p.requires_grad]
    if frozen and len(frozen) < len(all_params):
        first_i, first_name, _ = frozen[0]
        shifted = [n for n, p in all_params[first_i + 1:] if p.requires_grad]
        if shifted:
            out.append(Finding(
                "frozen-shift", "info", first_name,
                f"{len(frozen)} frozen parameters sit among trainable ones (first: {first_name}). "
                "parameters() still yields them, so parameters_to_vector(model.parameters()) "
                "includes them; a vector of trainable parameters only has different offsets for "
                f"{len(shifted)} trainable parameters after it (first: {shifted[0]})."))
    for name, p in params:
        others = names[id(p)][1:]
        if others:
            out.append(Finding(
                "tied", "info", name,
                f"{name} is also reachable as {', '.join(others)}: it is one Parameter object, so it "
                f"appears once in the flat vector ({p.numel()} elements, not {p.numel() * len(names[id(p)])})."))
    if any(p.device.type == "meta" for _, p in params):
        out.append(Finding(
            "meta", "info", "",
            "the model is on the meta device: offsets come from shapes alone; there are no values, "
            "so no gradients and no flat vector."))
    return out


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
        return (f"element {self.index} of the {self.total}-element vector is {self.name}[{idx}]"
                f"{alias}: element {self.offset} of its {self.end - self.start} "
                f"(range {self.start}..{self.end - 1}, shape {tuple(self.shape)})")


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


# --------------------------------------------------------------------------- gradient norms


@dataclass(frozen=True)
class GradientNorms:
    """Gradient norms per parameter and per module from one pass over the gradients.

    ``by_parameter`` has columns ``name, norm, state, nan, inf, numel, dtype, device,
    requires_grad``; ``by_module`` has ``name, norm, state, nan, inf, numel, parameters,
    ok, none, frozen, nonfinite, depth, owns_parameters, own_norm``. A module's ``norm`` covers
    every parameter below it, ``own_norm`` only those it holds itself (a layer's own weights).
    Norms are NaN where there is no gradient.
    """

    by_parameter: pd.DataFrame = field(repr=False)
    by_module: pd.DataFrame = field(repr=False)
    findings: list[Finding] = field(default_factory=list)
    total_norm: float = float("nan")

    @property
    def counts(self) -> dict[str, int]:
        """How many parameters are in each state (every state listed, zeros included)."""
        vc = self.by_parameter["state"].value_counts()
        return {s: int(vc.get(s, 0)) for s in STATES}


def _module_prefixes(name: str) -> list[str]:
    parts = name.split(".")[:-1]
    return [".".join(parts[:k]) for k in range(len(parts) + 1)]


def gradient_report(model: nn.Module, grads: Mapping[str, torch.Tensor | None] | None = None) -> GradientNorms:
    """Gradient norms per parameter and per module, plus findings, in one pass.

    A module's norm covers every parameter below it (each tensor once, tied ones under
    every module that holds them): the square root of the sum of their squared norms.
    States: ``ok``; ``none`` (requires grad, but there is no gradient: the loss did not reach
    it, or no backward pass ran); ``frozen`` (``requires_grad`` is False); ``nonfinite``
    (the gradient holds NaN or Inf; see the ``nan`` and ``inf`` counts). Gradients are read
    once, with one fused norm per device and dtype and one copy of the norms to the host per
    device; each is measured on its own device. Reading gradients changes nothing.

    For DTensor parameters (FSDP2, tensor parallel) ``norm`` is the global norm (the total
    equals ``torch.nn.utils.clip_grad_norm_``): each rank measures its pieces in the same
    pass and one ``all_reduce`` of the squares per sharding mesh dimension adds them up, so
    every rank must call it at the same time. ``by_parameter`` then also has ``local_norm``
    (this rank's piece), ``placements`` and ``nonfinite_ranks``; ``nan``/``inf`` count over
    all ranks.

    Args:
        model: the model; read, never changed.
        grads: gradients to measure instead of the parameters' ``.grad``: parameter name (any
            of a tied parameter's names) -> gradient, e.g. from ``torch.autograd.grad``.
            A parameter left out, or given ``None``, has no gradient.

    Raises:
        InspectorError: a gradient is on the meta device (it holds no numbers); ``grads``
            names no parameter of the model, names one twice, or does not match its shape.

    >>> m = nn.Sequential(nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False))
    >>> m[0].weight.grad = torch.tensor([[3.0]]); m[1].weight.grad = torch.tensor([[4.0]])
    >>> gradient_report(m).total_norm
    5.0
    >>> gradient_report(m, grads={"1.weight": torch.tensor([[12.0]])}).total_norm
    12.0
    """
    params, names = _unique_parameters(model)
    gradients = _gradients_of(model, params, names, grads)
    pieces = _pieces(params, gradients)
    return _report(params, names, gradients, pieces)


def _pieces(params: list[tuple[str, nn.Parameter]], gradients: list[torch.Tensor | None]) -> Pieces | None:
    """How to measure gradients held in pieces across processes (DTensor: FSDP2, tensor parallel)."""
    if not (has_dtensors(p for _, p in params) or has_dtensors(g for g in gradients if g is not None)):
        return None
    from .distributed.gradients import ShardedGradients
    return ShardedGradients()


def _gradients_of(model: nn.Module, params: list[tuple[str, nn.Parameter]], names: dict[int, list[str]],
               grads: Mapping[str, torch.Tensor | None] | None) -> list[torch.Tensor | None]:
    """The gradient of each parameter: its ``.grad``, or the one ``grads`` gives for it."""
    if grads is None:
        return [p.grad for _, p in params]
    if not isinstance(grads, Mapping):
        raise InspectorError(f"grads must map parameter names to gradient tensors, got {type(grads).__name__}")
    index: dict[str, int] = {}
    for i, (_, p) in enumerate(params):
        for alias in names[id(p)]:
            index[alias] = i
    out: list[torch.Tensor | None] = [None] * len(params)
    given: dict[int, str] = {}
    for key, g in grads.items():
        i = index.get(key)
        if i is None:
            close = difflib.get_close_matches(str(key), list(index), n=3, cutoff=0.5)
            hint = f"close names: {', '.join(close)}" if close else \
                f"parameter names look like: {', '.join(list(index)[:3])}"
            raise InspectorError(f"gradients were given for {key!r}, which is not a parameter of "
                                 f"{type(model).__name__}; {hint}")
        if g is not None and not isinstance(g, torch.Tensor):
            raise InspectorError(f"the gradient given for {key} is a {type(g).__name__}, not a tensor")
        name, p = params[i]
        if i in given and out[i] is not g:
            raise InspectorError(f"{key} and {given[i]} are one tied parameter, but two different "
                                 "gradients were given for it; give one, under either name")
        if g is not None and g.shape != p.shape:
            sharded = " (the parameter is a DTensor: give its gradient as a DTensor, as torch.autograd.grad " \
                "returns it, not this rank's local piece)" if has_dtensors([p]) and not has_dtensors([g]) else ""
            raise InspectorError(f"the gradient given for {key} has shape {tuple(g.shape)}, but the "
                                 f"parameter has shape {tuple(p.shape)}{sharded}")
        given[i] = key
        out[i] = g
    return out


def _report(params: list[tuple[str, nn.Parameter]], names: dict[int, list[str]],
            gradients: list[torch.Tensor | None], pieces: Pieces | None = None) -> GradientNorms:
    findings: list[Finding] = []
    dense_idx: list[int] = []
    dense: list[torch.Tensor] = []
    norms = [math.nan] * len(params)
    meta = [n for (n, _), g in zip(params, gradients) if g is not None and g.device.type == "meta"]
    if meta:
        raise InspectorError(
            f"the gradient of {meta[0]} ({len(meta)} gradients in all) is on the meta device: it has "
            "a shape but no numbers, so it has no norm. Load the model with weights on a real device "
            "and run a backward pass there.")
    for i, ((name, p), g) in enumerate(zip(params, gradients)):
        if g is None:
            continue
        if g.is_sparse:
            findings.append(Finding(
                "sparse-gradient", "info", name,
                f"{name} has a sparse gradient ({g._nnz()} stored rows of {p.shape[0]}): its norm comes "
                "from its coalesced values. parameters_to_vector(p.grad for p ...) cannot flatten it; "
                "use p.grad.to_dense() first, or an optimizer that takes sparse gradients."))
            norms[i] = float(torch.linalg.vector_norm(g.coalesce().values().float()))
            continue
        if g.layout != torch.strided:
            norms[i] = float(torch.linalg.vector_norm(g.to_dense().float()))
            continue
        dense_idx.append(i)
        dense.append(g)
    if pieces is None:
        measured = gradient_l2_norms(dense)
    else:
        measured = gradient_l2_norms(dense, local=pieces.local,
                                     reduce=lambda squares, idx: pieces.reduce(squares, [dense[k] for k in idx]))
    for i, v in zip(dense_idx, measured.tolist()):
        norms[i] = v
    counts, per_rank = _nonfinite_counts(gradients, norms, pieces)

    prows: list[tuple] = []
    modules: dict[str, list[float]] = {}   # name -> [sum of squares, nan, inf, numel, params, states x4, grads]
    own: dict[str, list[float]] = {}       # module -> [sum of squares of what it holds itself, grads]
    chains: dict[str, tuple[str, ...]] = {}  # module -> itself and every parent, root ("") first
    labels: dict[Any, str] = {}
    for i, (name, p) in enumerate(params):
        g = gradients[i]
        norm = norms[i]
        nan = inf = 0
        rg = p.requires_grad
        if g is None:
            state = "none" if rg else "frozen"
        else:
            nan, inf = counts.get(i, (0, 0))
            state = "frozen" if not rg else "nonfinite" if nan or inf else "ok"
        numel = p.numel()
        dt, dev = p.dtype, (p.device if g is None else g.device)
        dt_name = labels.get(dt) or labels.setdefault(dt, str(dt).removeprefix("torch."))
        dev_name = labels.get(dev) or labels.setdefault(dev, str(dev))
        prows.append((name, norm, state, nan, inf, numel, dt_name, dev_name, rg))
        has = g is not None
        sq = norm * norm if has else 0.0
        aliases = names[id(p)]
        if len(aliases) == 1:
            holders = (name.rpartition(".")[0],)
        else:
            holders = tuple(dict.fromkeys(a.rpartition(".")[0] for a in aliases))
        prefixes: dict[str, None] = {}
        for holder in holders:
            acc = own.get(holder)
            if acc is None:
                acc = own[holder] = [0.0, 0]
            acc[0] += sq
            acc[1] += has
            chain = chains.get(holder)
            if chain is None:
                chain = chains[holder] = tuple(_module_prefixes(holder + ".x"))
            prefixes.update(dict.fromkeys(chain))
        col = 5 + STATES.index(state)
        for prefix in prefixes:
            acc = modules.get(prefix)
            if acc is None:
                acc = modules[prefix] = [0.0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
            acc[0] += sq
            acc[1] += nan
            acc[2] += inf
            acc[3] += numel
            acc[4] += 1
            acc[col] += 1
            acc[9] += has
    pcols = list(zip(*prows)) if prows else [[] for _ in PARAMETER_NORM_COLUMNS]
    by_parameter = _frame(PARAMETER_NORM_COLUMNS, dict(zip(PARAMETER_NORM_COLUMNS, pcols)))

    mrows = []
    for prefix, (sq, nan, inf, numel, count, ok, none, frozen, nonfinite, with_grad) in modules.items():
        state = "nonfinite" if nonfinite else "ok" if ok else "none" if none else "frozen"
        held = own.get(prefix)
        mrows.append((prefix if prefix else ROOT, math.sqrt(sq) if with_grad else math.nan, state, nan, inf,
                      numel, count, ok, none, frozen, nonfinite, 0 if not prefix else prefix.count(".") + 1,
                      held is not None,
                      math.sqrt(held[0]) if held is not None and held[1] else math.nan))
    mcols = list(zip(*mrows)) if mrows else [[] for _ in MODULE_NORM_COLUMNS]
    by_module = _frame(MODULE_NORM_COLUMNS, dict(zip(MODULE_NORM_COLUMNS, mcols)))
    total = mrows[0][1] if mrows else math.nan
    findings += _gradient_findings(prows)
    if pieces is not None:  # this rank's norms, placements, and the ranks whose pieces are not finite
        from .distributed.gradients import with_rank_columns
        by_parameter, findings = with_rank_columns(by_parameter, [p for _, p in params], gradients, pieces,
                                                   per_rank, findings)
    return GradientNorms(by_parameter, by_module, findings, total)


def _nonfinite_counts(gradients: list[torch.Tensor | None], norms: list[float], pieces: Pieces | None
                      ) -> tuple[dict[int, tuple[int, int]], dict[int, list[tuple[int, int]]]]:
    """NaN and Inf counts of each gradient whose norm is not finite, in place of ``norms`` the norm
    in float64 where the values are finite but their norm overflowed the gradient's dtype.

    Returns:
        (index -> total (NaN, Inf)), and for pieces (index -> (NaN, Inf) of each process's piece).
    """
    bad = [i for i, g in enumerate(gradients) if g is not None and not math.isfinite(norms[i])]
    if not bad:
        return {}, {}
    local = []
    for i in bad:
        g = gradients[i]
        values = g.coalesce().values() if g.is_sparse else g if pieces is None else pieces.local(g)
        local.append((int(torch.isnan(values).sum()), int(torch.isinf(values).sum())))
    per_rank: dict[int, list[tuple[int, int]]] = {}
    if pieces is None:
        totals = dict(zip(bad, local))
    else:  # every process has the same ``bad``: the reduced norms are the same everywhere
        gathered = pieces.gather_counts(torch.tensor(local, dtype=torch.int64).reshape(len(bad), 2)).tolist()
        per_rank = {i: [tuple(rank[k]) for rank in gathered] for k, i in enumerate(bad)}
        totals = {i: (sum(c[0] for c in v), sum(c[1] for c in v)) for i, v in per_rank.items()}
    for i in bad:
        if totals[i] != (0, 0):
            continue
        g = gradients[i]  # finite values whose norm overflowed the grad's dtype
        values = g.coalesce().values() if g.is_sparse else g
        if pieces is None:
            norms[i] = float(torch.linalg.vector_norm(values.double()))
        else:
            square = torch.linalg.vector_norm(pieces.local(values).double()).square().reshape(1)
            norms[i] = float(pieces.reduce(square, [g]).sqrt())
    per_rank = {i: v for i, v in per_rank.items() if totals[i] != (0, 0)}
    return totals, per_rank


def _gradient_findings(rows: list[tuple]) -> list[Finding]:
    """Findings from the per-parameter rows (name, norm, state, nan, inf, numel, dtype, device, rg)."""
    out: list[Finding] = []
    trainable = [r for r in rows if r[8]]
    if trainable and all(r[2] == "none" for r in trainable):
        out.append(Finding(
            "no-gradients", "warning", "",
            "no trainable parameter has a gradient yet. Run a backward pass: the 'Run a backward "
            "pass' button on the Flatten map page, `python -m inspector offsets SOURCE --backward`, "
            "inspector.offsets.run_backward(loaded), or loss.backward() on a batch of your own."))
        return out
    if rows and not trainable:
        out.append(Finding("all-frozen", "info", "",
                           "every parameter has requires_grad=False: there is nothing to train"))
    none = [r[0] for r in rows if r[2] == "none"]
    if none:
        out.append(Finding(
            "unreached", "warning", none[0],
            f"{len(none)} trainable parameters have no gradient although others do (first: "
            f"{none[0]}): the loss does not depend on them, or they were skipped in "
            "the forward pass. An optimizer leaves them unchanged."))
    for name, _, state, nan, inf, numel, *_ in rows:
        if state == "nonfinite":
            out.append(Finding(
                "nonfinite-gradient", "error", name,
                f"the gradient of {name} holds {nan} NaN and {inf} Inf values of {numel}; one "
                "optimizer step spreads them to the weights."))
    stale = [r[0] for r in rows if not r[8] and not math.isnan(r[1])]
    if stale:
        out.append(Finding(
            "frozen-with-gradient", "info", stale[0],
            f"{len(stale)} frozen parameters still hold a gradient (first: {stale[0]}): "
            "an optimizer that was given them still applies it (and weight decay). Set their .grad "
            "to None, or leave them out of the optimizer."))
    return out


def gradient_norms(model: nn.Module, by: str = "parameter",
                   grads: Mapping[str, torch.Tensor | None] | None = None) -> pd.DataFrame:
    """L2 norm of each parameter's gradient, or of each module's (over all parameters below it).

    Each call reads the gradients as they are now (one pass, nothing is cached). To get
    both tables, call :func:`gradient_report` once: it returns ``by_parameter`` and
    ``by_module`` (and the findings) from a single pass, where two calls here make two.

    Args:
        model: the model; its gradients are read, never changed.
        by: ``"parameter"`` or ``"module"``.
        grads: gradients to use instead of ``.grad`` (parameter name -> tensor), e.g. from
            ``torch.autograd.grad``; see :func:`gradient_report`.

    Returns:
        Columns ``name, norm, state, ...`` (see :class:`GradientNorms`); ``state`` is one of
        ``"ok" | "none" | "frozen" | "nonfinite"``. Module names are dotted prefixes; the
        model itself is ``"(model)"``.

    >>> m = nn.Sequential(nn.Linear(2, 1, bias=False), nn.Linear(1, 1))
    >>> m[0].weight.grad = torch.tensor([[3.0, 4.0]])
    >>> gradient_norms(m)[["name", "norm", "state"]].values.tolist()[:2]
    [['0.weight', 5.0, 'ok'], ['1.weight', nan, 'none']]
    >>> gradient_norms(m, by="module")["name"].tolist()
    ['(model)', '0', '1']
    """
    model = require_module(model, "gradient_norms")
    if by not in ("parameter", "module"):
        raise InspectorError(f"gradient_norms(by={by!r}): choose 'parameter' or 'module'")
    params, names = _unique_parameters(model)
    gradients = _gradients_of(model, params, names, grads)
    report = _report(params, names, gradients, _pieces(params, gradients))
    return report.by_parameter if by == "parameter" else report.by_module


# --------------------------------------------------------------------------- backward pass


@dataclass(frozen=True)
class BackwardResult:
    """What :func:`run_backward` did to the model (it sets ``.grad``, nothing else)."""

    loss: float
    batch_size: int
    with_gradient: int       # trainable parameters that got a gradient
    without_gradient: int    # trainable parameters the loss did not reach
    frozen: int
    replaced: int            # parameters whose earlier .grad was dropped first
    seconds: float
    message: str


def run_backward(loaded: Any, batch_size: int = 2, accumulate: bool = False) -> BackwardResult:
    """Run the model's loss on its example inputs and call ``backward()``, changing ``.grad``.

    This is the one change the inspector makes to a model, and only when asked. It holds
    the model's lock, runs in eval mode (so dropout is off and BatchNorm's running
    statistics are not updated) and restores the ``training`` flag of every module
    afterwards, also when the forward pass raises. ``requires_grad`` is untouched.

    Args:
        loaded: a :class:`~inspector.models.LoadedModel` with example inputs and a loss.
        batch_size: how many examples.
        accumulate: add to existing gradients instead of dropping them first.

    Raises:
        InspectorError: the model is on the meta device, has no loss, or the loss is not a
            scalar.

    >>> from inspector.models import load_model
    >>> r = run_backward(load_model("sample:frozen-adapter"))
    >>> r.with_gradient, r.frozen
    (6, 6)
    """
    from .models import call_model, model_code

    model: nn.Module = loaded.model
    loaded.check_runnable()
    if not loaded.has_loss:
        raise InspectorError(f"model {loaded.name!r} defines no loss, so there is nothing to run "
                             "backward on; a Python model file can define loss(outputs, inputs)")
    with model_lock(model):
        modes = {m: m.training for m in model.modules()}
        params = list(model.parameters())
        replaced = 0
        start = time.perf_counter()
        try:
            model.eval()
            inputs = loaded.example_inputs(batch_size)
            with torch.enable_grad(), model_code(f"the forward pass of {loaded.name}",
                                                  "fix its forward (or example_inputs) in the model file"):
                outputs = call_model(model, inputs)
            with torch.enable_grad():
                loss = loaded.loss(outputs, inputs)
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                    raise InspectorError(f"the loss of {loaded.name!r} is not a scalar ({shape}); "
                                         "reduce it (e.g. .mean()) in loss(outputs, inputs)")
                if not loss.requires_grad:
                    raise InspectorError(f"the loss of {loaded.name!r} does not depend on any parameter "
                                         "that requires a gradient; nothing to run backward on")
                if not accumulate:
                    for p in params:
                        if p.grad is not None:
                            replaced += 1
                            p.grad = None
                with model_code(f"the backward pass of {loaded.name}",
                                "fix the loss or the forward in the model file"):
                    loss.backward()
        finally:
            for m, was_training in modes.items():
                m.training = was_training
        seconds = time.perf_counter() - start
    trainable = [p for p in params if p.requires_grad]
    with_grad = sum(p.grad is not None for p in trainable)
    frozen = len(params) - len(trainable)
    value = float(loss.detach())
    verb = "added to" if accumulate else "set"
    message = (f"Ran a backward pass on {batch_size} example inputs (loss {value:.6g}) in eval mode: "
               f"{verb} .grad of {with_grad} of {len(trainable)} trainable parameters"
               + (f" ({replaced} earlier gradients dropped first)" if replaced else "")
               + (f"; {len(trainable) - with_grad} were not reached" if len(trainable) > with_grad else "")
               + f". Nothing else changed: {frozen} frozen parameters, buffers and training flags "
               "are as they were.")
    return BackwardResult(value, batch_size, with_grad, len(trainable) - with_grad, frozen, replaced,
                          seconds, message)


# --------------------------------------------------------------------------- round trip


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


def _overlaps(a: torch.Tensor, tensors: Iterable[torch.Tensor]) -> bool:
    lo = a.data_ptr()
    hi = lo + a.numel() * a.element_size()
    for t in tensors:
        if t.device != a.device or t.numel() == 0:
            continue
        s = t.untyped_storage()
        tlo = s.data_ptr()
        thi = tlo + s.nbytes()
        if tlo < hi and lo < thi:
            return True
    return False


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
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    with model_lock(model):
        named = list(model.named_parameters())
        originals = [p for _, p in named]
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
    steps = [f"copied the {len(copies)} tensors that parameters() yields ({total:,} elements)"]
    try:
        with torch.no_grad():
            vec = parameters_to_vector(copies)
    except RuntimeError as exc:
        msg = str(exc).splitlines()[0]
        steps.append(f"parameters_to_vector raised: {msg}")
        return RoundTrip(len(copies), 0, "", False, False, False, (), False,
                         _untouched(originals, before), msg, tuple(steps))
    shares = _overlaps(vec, copies)
    steps.append(f"vec = parameters_to_vector(params): {vec.numel():,} elements of {str(vec.dtype).removeprefix('torch.')}; it "
                 f"{'shares' if shares else 'shares no'} memory with the parameters")
    write_through = False
    if vec.numel():
        with torch.no_grad():
            first = copies[0].detach().reshape(-1)
            probe = first[0].clone()
            vec[0] += 1
            write_through = not torch.equal(first[0], probe)
            vec[0] = probe.to(vec.dtype)
        steps.append("vec[0] += 1 changed the first parameter: the vector aliases it" if write_through
                     else "vec[0] += 1 left the first parameter unchanged: the vector is a copy")
    dtypes_before = [p.dtype for p in copies]
    with torch.no_grad():
        for c in copies:       # scribble over the copies so that restoring is really tested
            c.data = torch.full_like(c.data, float("nan")) if c.is_floating_point() else torch.zeros_like(c.data)
        vector_to_parameters(vec, copies)
    changed = tuple(n for (n, _), c, d in zip(named, copies, dtypes_before) if c.dtype != d)
    exact = all(torch.equal(c.detach().to(b.dtype), b) for c, b in zip(copies, before))
    views = _overlaps(vec, copies[:1]) if copies else False
    steps.append("vector_to_parameters(vec, params) after overwriting them with NaN: values "
                 + ("restored exactly (torch.equal on every tensor)" if exact else "NOT restored exactly"))
    if changed:
        steps.append(f"it changed the dtype of {len(changed)} parameters to {vec.dtype} (first: {changed[0]})")
    steps.append("the parameters are now views into vec (param.data = vec[a:b].view_as(param)): writing "
                 "vec now changes them" if views else "the parameters do not share memory with vec")
    untouched = _untouched(originals, before)
    steps.append("the model's own parameters were not touched" if untouched else
                 "the model's own parameters changed while this ran")
    return RoundTrip(len(copies), vec.numel(), str(vec.dtype).removeprefix("torch."), shares, write_through,
                     exact, changed, views, untouched, None, tuple(steps))


def _untouched(originals: list[nn.Parameter], before: list[torch.Tensor]) -> bool:
    with torch.no_grad():
        return all(torch.equal(p.detach(), b) for p, b in zip(originals, before))


# --------------------------------------------------------------------------- tables


def state_counts(table: pd.DataFrame) -> dict[str, int]:
    """Rows per gradient state of a :func:`gradient_norms` table (all states, zeros included).

    >>> state_counts(pd.DataFrame({"state": ["ok", "ok", "frozen"]}))
    {'ok': 2, 'none': 0, 'frozen': 1, 'nonfinite': 0}
    """
    vc = table["state"].value_counts()
    return {s: int(vc.get(s, 0)) for s in STATES}


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
