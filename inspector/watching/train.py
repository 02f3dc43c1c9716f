"""A short training loop under :func:`watch`, for ``python -m inspector watch`` and the labs."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from ..loading.models import call_model, to_device
from ..utils.findings import InspectorError
from .block import watch
from .result import WatchResult

OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
}


def make_optimizer(model: nn.Module, name: str, lr: float) -> torch.optim.Optimizer:
    """``name`` (``sgd``, ``adam`` or ``adamw``) over every trainable parameter of ``model``."""
    if name not in OPTIMIZERS:
        raise InspectorError(f"optimizer {name!r}: choose one of {', '.join(OPTIMIZERS)}")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise InspectorError("the model has no trainable parameter to optimize")
    return OPTIMIZERS[name](params, lr=lr)


def train_watched(
    model: nn.Module,
    inputs_fn: Callable[[int], Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    steps: int,
    path: str | os.PathLike,
    *,
    optimizer: str | torch.optim.Optimizer = "adamw",
    lr: float = 1e-3,
    batch_size: int = 2,
    device: torch.device | str = "cpu",
    before_step: Callable[[nn.Module, int], None] | None = None,
    **options: Any,
) -> WatchResult:
    """``steps`` steps of ``loss_fn(model(x), x)`` with a fresh batch from ``inputs_fn(batch_size)``
    each step, watched into ``path`` (``options`` go to :func:`watch`).

    ``before_step(model, step)``, if given, runs before each step's forward pass (labs use it
    to plant a fault).
    """
    device = torch.device(device)
    opt = make_optimizer(model, optimizer, lr) if isinstance(optimizer, str) else optimizer
    with watch(model, opt, path, **options) as w:
        for step in range(steps):
            if before_step is not None:
                before_step(model, step)
            inputs = to_device(inputs_fn(batch_size), device)
            loss = loss_fn(call_model(model, inputs), inputs)
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
    assert w.result is not None
    return w.result
