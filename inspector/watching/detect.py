"""Findings from one step's numbers on the host: dead, exploding and non-finite values."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from ..utils.findings import Finding
from ..utils.labels import ROOT_LABEL, module_label
from .layout import Layout


class Detectors:
    """State kept across steps for the findings that need a history.

    Args:
        layout: what is watched.
        window: steps a gradient may stay missing or zero before ``dead-gradient``.
        explode_factor: a module whose gradient norm exceeds this many times the median of
            its last ``history`` norms gets ``exploding-gradient`` (after ``min_history`` steps).
        loss_factor: a logged loss over this many times the median of the last ``history`` positive
            losses is a ``loss-spike`` (after ``min_history`` of them).
    """

    def __init__(self, layout: Layout, *, window: int = 5, explode_factor: float = 10.0,
                 loss_factor: float = 3.0, history: int = 50, min_history: int = 5) -> None:
        self.layout = layout
        self.window = window
        self.explode_factor = explode_factor
        self.loss_factor = loss_factor
        self.min_history = min_history
        self.dead = np.zeros(len(layout.parameters), dtype=np.int64)
        self.history: deque[np.ndarray] = deque(maxlen=history)
        self.losses: deque[float] = deque(maxlen=history)

    def loss(self, value: float) -> list[Finding]:
        """``loss-spike`` when ``value`` is over ``loss_factor`` times the median of the last losses
        (finite and positive ones; a loss that can be negative is not judged)."""
        if not (math.isfinite(value) and value > 0):
            return []
        out = []
        if len(self.losses) >= self.min_history:
            median = float(np.median(self.losses))
            if value > self.loss_factor * median:
                out.append(Finding(
                    "loss-spike", "warning", ROOT_LABEL,
                    f"the loss is {value:.4g}, {value / median:.3g}x its median over the last "
                    f"{len(self.losses)} steps ({median:.4g}): look at this step's batch and the gradient "
                    "norms around it, or lower the learning rate"))
        self.losses.append(value)
        return out

    def gradients(
        self, param_grad: np.ndarray, has_grad: np.ndarray, module_grad: np.ndarray
    ) -> list[Finding]:
        """``dead-gradient`` and ``exploding-gradient`` from one step's gradient norms."""
        out = []
        zero = ~has_grad | (param_grad == 0)
        self.dead = np.where(zero, self.dead + 1, 0)
        for i in np.flatnonzero(self.dead == self.window):
            name = self.layout.parameters[i]
            out.append(
                Finding(
                    "dead-gradient",
                    "warning",
                    name,
                    f"{name} had no gradient, or an all-zero one, for {self.window} steps: it does not "
                    "take part in the loss (an unused branch, a detach(), a frozen path) or its "
                    "gradient is killed (dead ReLUs, a zero mask)",
                )
            )
        if len(self.history) >= self.min_history:
            past = np.stack(self.history)
            past = np.where(np.isfinite(past) & (past > 0), past, np.nan)
            with np.errstate(all="ignore"):
                median = (
                    np.nanmedian(past, axis=0) if np.isfinite(past).any() else np.full(past.shape[1], np.nan)
                )
                ratio = module_grad / median
            for i in np.flatnonzero(np.isfinite(ratio) & (ratio > self.explode_factor)):
                name = self.layout.modules[i]
                out.append(
                    Finding(
                        "exploding-gradient",
                        "warning",
                        module_label(name),
                        f"gradient norm of {name or 'the root module'} is {ratio[i]:.3g}x its median "
                        f"over the last {len(self.history)} steps ({module_grad[i]:.3g} vs "
                        f"{median[i]:.3g}): lower its learning rate, clip gradients, or check its input",
                    )
                )
        self.history.append(np.asarray(module_grad, dtype=np.float64))
        return out

    def parameters(
        self, param_norm: np.ndarray, buffer_norm: np.ndarray, buffers: tuple[str, ...]
    ) -> list[Finding]:
        """``nonfinite-parameter`` for the parameters and buffers whose values hold NaN/Inf (one
        finding per kind, naming the first in model order and counting the others)."""
        out = []
        for names, norms, kind in (
            (self.layout.parameters, param_norm, "parameter"),
            (buffers, buffer_norm, "buffer"),
        ):
            bad = [names[i] for i in np.flatnonzero(np.isinf(norms) | np.isnan(norms))]
            if not bad:
                continue
            others = (
                f" (and {len(bad) - 1} other {kind}s: {', '.join(bad[1:4])}{', ...' if len(bad) > 4 else ''})"
            )
            out.append(
                Finding(
                    "nonfinite-parameter",
                    "error",
                    bad[0],
                    f"{kind} {bad[0]}{others if len(bad) > 1 else ''} holds NaN/Inf values (not only its "
                    "gradient): the last optimizer step or a write into it made it so; every later "
                    "output that uses it is non-finite",
                )
            )
        return out


def not_in_optimizer(names: tuple[str, ...], tensors: list, held: set[int]) -> list[Finding]:
    """``not-in-optimizer`` for each trainable parameter that no param group holds."""
    return [
        Finding(
            "not-in-optimizer",
            "error",
            n,
            f"{n} requires grad but no param group of the optimizer holds it: it never changes. Build "
            "the optimizer from model.parameters() after every change to the model (after "
            "load_state_dict(assign=True), .to(), or adding a layer)",
        )
        for n, t in zip(names, tensors, strict=True)
        if t is not None and id(t) not in held
    ]
