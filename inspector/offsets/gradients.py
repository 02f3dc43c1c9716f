"""Gradient norms per parameter and per module, and what they show, from one pass.

The gradients are read once (:mod:`.gradient_pass`: one fused norm per device and dtype);
a module's norm is the root of the summed squares of the parameters below it, added to
every parent prefix in the same walk (:mod:`.gradient_rows`).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

import pandas as pd
import torch
from torch import nn

from ..inventory import tensor_inventory
from ..utils.checks import require_module
from ..utils.dtensors import has_dtensors
from ..utils.findings import Finding, InspectorError
from ..utils.program import program_name
from ._tables import (
    MODULE_NORM_COLUMNS,
    PARAMETER_NORM_COLUMNS,
    STATES,
    frame,
)
from .gradient_pass import Pieces, gradient_l2_norms
from .gradient_rows import module_rows, rows_and_sums

Params = list[tuple[str, torch.Tensor]]
Gradients = list[torch.Tensor | None]

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


def gradient_report(
    model: nn.Module, grads: Mapping[str, torch.Tensor | None] | None = None
) -> GradientNorms:
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
    model = require_module(model, "gradient_report")
    params, shared = tensor_inventory(model, include_buffers=False).named_unique()
    gradients = _gradients_of(model, params, shared, grads)
    return _report(params, shared, gradients, _pieces(params, gradients))


def _pieces(params: Params, gradients: list[torch.Tensor | None]) -> Pieces | None:
    """How to measure gradients held in pieces across processes (DTensor: FSDP2, tensor parallel)."""
    if not (has_dtensors(p for _, p in params) or has_dtensors(g for g in gradients if g is not None)):
        return None
    from ..sharding import ShardedGradients
    return ShardedGradients()


def _gradients_of(model: nn.Module, params: Params, shared: dict[int, list[str]],
               grads: Mapping[str, torch.Tensor | None] | None) -> list[torch.Tensor | None]:
    """The gradient of each parameter: its ``.grad``, or the one ``grads`` gives for it."""
    if grads is None:
        return [p.grad for _, p in params]
    if not isinstance(grads, Mapping):
        raise InspectorError(
            f"grads must map parameter names to gradient tensors, got {type(grads).__name__}"
        )
    index: dict[str, int] = {}
    for j, (name, p) in enumerate(params):
        for alias in shared.get(id(p), (name,)):
            index[alias] = j
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
            sharded = (
                " (the parameter is a DTensor: give its gradient as a DTensor, as torch.autograd.grad "
                "returns it, not this rank's local piece)"
                if has_dtensors([p]) and not has_dtensors([g])
                else ""
            )
            raise InspectorError(f"the gradient given for {key} has shape {tuple(g.shape)}, but the "
                                 f"parameter has shape {tuple(p.shape)}{sharded}")
        given[i] = key
        out[i] = g
    return out


def _report(params: Params, shared: dict[int, list[str]], gradients: Gradients,
            pieces: Pieces | None = None) -> GradientNorms:
    findings: list[Finding] = []
    norms = _measure(params, gradients, pieces, findings)
    counts, per_rank = _nonfinite_counts(gradients, norms, pieces)
    prows, modules, own = rows_and_sums(params, shared, gradients, norms, counts)
    by_parameter = frame(PARAMETER_NORM_COLUMNS, prows)
    mrows = module_rows(modules, own)
    by_module = frame(MODULE_NORM_COLUMNS, mrows)
    total = mrows[0][1] if mrows else math.nan
    findings += _gradient_findings(prows)
    if pieces is not None:  # this rank's norms, placements, and the ranks whose pieces are not finite
        from ..sharding import ShardedGradients, with_rank_columns
        by_parameter, findings = with_rank_columns(by_parameter, [p for _, p in params], gradients,
                                                   cast(ShardedGradients, pieces),  # made by _pieces
                                                   per_rank, findings)
    return GradientNorms(by_parameter, by_module, findings, total)


def _measure(
    params: Params, gradients: Gradients, pieces: Pieces | None, findings: list[Finding]
) -> list[float]:
    """The norm of every gradient (NaN where there is none): dense ones in one fused pass."""
    meta = [
        n for (n, _), g in zip(params, gradients, strict=True) if g is not None and g.device.type == "meta"
    ]
    if meta:
        raise InspectorError(
            f"the gradient of {meta[0]} ({len(meta)} gradients in all) is on the meta device: it has "
            "a shape but no numbers, so it has no norm. Load the model with weights on a real device "
            "and run a backward pass there.")
    norms = [math.nan] * len(params)
    dense_idx: list[int] = []
    dense: list[torch.Tensor] = []
    for i, ((name, p), g) in enumerate(zip(params, gradients, strict=True)):
        if g is None:
            continue
        if g.is_sparse:
            findings.append(Finding(
                "sparse-gradient", "info", name,
                f"{name} has a sparse gradient ({g._nnz()} stored rows of {p.shape[0]}): its norm comes "
                "from its coalesced values. parameters_to_vector(p.grad for p ...) cannot flatten it; "
                "use p.grad.to_dense() first, or an optimizer that takes sparse gradients."))
            norms[i] = float(torch.linalg.vector_norm(g.coalesce().values().float()))
        elif g.layout != torch.strided:
            norms[i] = float(torch.linalg.vector_norm(g.to_dense().float()))
        else:
            dense_idx.append(i)
            dense.append(g)
    if pieces is None:
        measured = gradient_l2_norms(dense)
    else:
        measured = gradient_l2_norms(
            dense,
            local=pieces.local,
            reduce=lambda squares, idx: pieces.reduce(squares, [dense[k] for k in idx]),
        )
    for i, v in zip(dense_idx, measured.tolist(), strict=True):
        norms[i] = v
    return norms


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
        g = cast(torch.Tensor, gradients[i])  # ``bad`` holds gradients only
        values = g.coalesce().values() if g.is_sparse else g if pieces is None else pieces.local(g)
        local.append((int(torch.isnan(values).sum()), int(torch.isinf(values).sum())))
    per_rank: dict[int, list[tuple[int, int]]] = {}
    if pieces is None:
        totals = dict(zip(bad, local, strict=True))
    else:  # every process has the same ``bad``: the reduced norms are the same everywhere
        gathered = pieces.gather_counts(torch.tensor(local, dtype=torch.int64).reshape(len(bad), 2)).tolist()
        per_rank = {i: [tuple(rank[k]) for rank in gathered] for k, i in enumerate(bad)}
        totals = {i: (sum(c[0] for c in v), sum(c[1] for c in v)) for i, v in per_rank.items()}
    for i in bad:
        if totals[i] != (0, 0):
            continue
        g = cast(torch.Tensor, gradients[i])  # finite values whose norm overflowed the grad's dtype
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
            f"pass' button on the Flatten map page, `{program_name()} offsets SOURCE --backward`, "
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
    params, shared = tensor_inventory(model, include_buffers=False).named_unique()
    gradients = _gradients_of(model, params, shared, grads)
    report = _report(params, shared, gradients, _pieces(params, gradients))
    return report.by_parameter if by == "parameter" else report.by_module


def state_counts(table: pd.DataFrame) -> dict[str, int]:
    """Rows per gradient state of a :func:`gradient_norms` table (all states, zeros included).

    >>> state_counts(pd.DataFrame({"state": ["ok", "ok", "frozen"]}))
    {'ok': 2, 'none': 0, 'frozen': 1, 'nonfinite': 0}
    """
    vc = table["state"].value_counts()
    return {s: int(vc.get(s, 0)) for s in STATES}
