"""What an attribution found: :class:`Attribution`, its summary table and completeness."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import torch

from ..utils.findings import Finding
from .methods import captum_attr

DELTA_RELATIVE_TOLERANCE = 0.05
DELTA_ABSOLUTE_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Completeness:
    """How far the attributions' sum is from ``F(input) - F(baseline)``, per sample.

    ``trusted`` is True when every ``|delta|`` is at most ``tolerance * |output_diff|``
    (or below ``1e-5`` where the output barely moves).
    """

    delta: tuple[float, ...]
    output_diff: tuple[float, ...]
    max_abs_delta: float
    max_relative: float
    tolerance: float
    trusted: bool


@dataclass(frozen=True)
class Attribution:
    """What :func:`attribute` found.

    Attributes:
        method: the method that ran (``"layer_ig"`` when ``"ig"`` was asked on token ids).
        requested: the method that was asked for.
        captum_method: the captum class used.
        target: the class or next-token index attributed (None for one-output models).
        position: the sequence position attributed for ``(B, T, V)`` outputs, else None.
        layer: the module name for layer methods, else None.
        attributions: detached CPU tensors, one per model input (or the layer output).
        inputs: detached CPU copies of the inputs (token ids or images, for figures).
        delta: captum's convergence delta per sample, where the method has one.
        token_model: the model takes integer token ids.
        findings: NaNs, a poor convergence delta, a method switch, the mode used.

    ``summary`` (built on first use) has one row per (tensor, sample, index along dim 1):
    columns ``tensor, sample, index, token, label, score, abs_score, nans``; ``score`` is NaN
    where any value it sums is NaN. For token models the index is the position.
    """

    method: str
    requested: str
    captum_method: str
    target: int | None
    position: int | None
    layer: str | None
    attributions: tuple[torch.Tensor, ...]
    inputs: tuple[torch.Tensor, ...]
    delta: torch.Tensor | None = None
    token_model: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @cached_property
    def summary(self) -> pd.DataFrame:
        return attribution_summary(self.attributions, self.inputs, self.token_model, self.layer)

    def completeness(self, tolerance: float = DELTA_RELATIVE_TOLERANCE) -> Completeness | None:
        """Completeness of IG-style methods (None for methods without a delta).

        ``output_diff`` is recovered as ``sum(attributions) - delta`` (captum's delta is
        ``sum(attributions) - (F(x) - F(baseline))``).
        """
        if self.delta is None:
            return None
        delta = self.delta.detach().double().reshape(-1)
        sums = sum(a.detach().double().reshape(a.shape[0], -1).sum(1) for a in self.attributions)
        diff = sums - delta
        rel = delta.abs() / diff.abs().clamp_min(1e-12)
        ok = bool(((delta.abs() <= tolerance * diff.abs()) | (delta.abs() <= DELTA_ABSOLUTE_TOLERANCE)).all())
        return Completeness(tuple(delta.tolist()), tuple(diff.tolist()), float(delta.abs().max()),
                            float(rel.max()), tolerance, ok and bool(torch.isfinite(delta).all()))

    def pixel_map(self, sample: int = 0) -> np.ndarray | None:
        """A (H, W) map at the input's resolution for image inputs, summed over channels.

        Layer maps (GradCAM, conductance of a conv layer) are upsampled bilinearly.
        None when the input or the attribution is not image-shaped.
        """
        if not self.inputs or self.inputs[0].dim() != 4 or self.attributions[0].dim() != 4:
            return None
        a = self.attributions[0][sample:sample + 1].sum(1, keepdim=True)  # (1, 1, h, w)
        size = tuple(self.inputs[0].shape[-2:])
        if tuple(a.shape[-2:]) != size:
            a = captum_attr().LayerAttribution.interpolate(a, size, "bilinear")
        return a[0, 0].numpy()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: NaN becomes None; tensors are described by shape, the summary kept."""
        comp = self.completeness()
        summary = self.summary.astype(object).where(self.summary.notna(), None)
        return {
            "method": self.method, "requested": self.requested, "captum_method": self.captum_method,
            "target": self.target, "position": self.position, "layer": self.layer,
            "token_model": self.token_model,
            "options": {k: _jsonable(v) for k, v in self.options.items()},
            "attribution_shapes": [list(a.shape) for a in self.attributions],
            "summary": summary.to_dict(orient="records"),
            "delta": None if self.delta is None else [_finite_or_none(v) for v in self.delta.tolist()],
            "completeness": None if comp is None else {
                "max_abs_delta": _finite_or_none(comp.max_abs_delta),
                "max_relative": _finite_or_none(comp.max_relative),
                "tolerance": comp.tolerance, "trusted": comp.trusted},
            "findings": [f.to_dict() for f in self.findings],
        }


def new_result(**fields: Any) -> Attribution:
    """``Attribution(**fields)`` with every field given, filled in one step (a frozen
    dataclass's ``__init__`` sets its fields one ``object.__setattr__`` at a time)."""
    assert fields.keys() == _RESULT_FIELDS
    result = object.__new__(Attribution)
    result.__dict__.update(fields)
    return result


AttributionResult = Attribution  # the earlier name, kept for callers

_RESULT_FIELDS = {f.name for f in dataclasses.fields(Attribution)}


def _finite_or_none(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return f"tensor{list(v.shape)}"
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)


def attribution_summary(attributions: tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...],
             tokens: bool, layer: str | None) -> pd.DataFrame:
    frames = []
    ids = inputs[0] if tokens else None
    for i, a in enumerate(attributions):
        name = layer or (f"input {i}" if len(attributions) > 1 else "input")
        B = a.shape[0]
        a3 = a.reshape(B, a.shape[1] if a.dim() > 1 else 1, -1).double()  # (B, D1, rest)
        D = a3.shape[1]
        score = a3.sum(-1).numpy()
        abs_score = a3.abs().sum(-1).numpy()
        nans = torch.isnan(a3).sum(-1).numpy()
        sample = np.repeat(np.arange(B), D)
        index = np.tile(np.arange(D), B)
        per_token = ids is not None and ids.dim() >= 2 and tuple(ids.shape[:2]) == (B, D)
        if per_token and ids is not None:
            tok = ids[:, :D].reshape(-1).numpy().astype(np.int64)
            token = pd.array(tok, dtype="Int64")
            label = [f"{p}:{t}" for p, t in zip(index, tok, strict=True)]
        else:
            token = pd.array([None] * (B * D), dtype="Int64")
            kind = "channel" if a.dim() >= 4 else "feature" if a.dim() == 2 else "unit"
            label = [f"{kind} {j}" for j in index] if a.dim() > 1 else ["output"] * (B * D)
        frames.append(pd.DataFrame({
            "tensor": name, "sample": sample, "index": index, "token": token, "label": label,
            "score": score.reshape(-1), "abs_score": abs_score.reshape(-1),
            "nans": nans.reshape(-1).astype(np.int64)}))
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]
