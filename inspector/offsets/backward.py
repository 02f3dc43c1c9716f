"""Gradients of a model's loss, returned to the caller rather than left in the model's ``.grad``.

A model shared by several users (one cached model on a dashboard server) must not carry
one user's gradients into another user's view. :func:`loss_gradients` runs the loss on
the example inputs and asks ``torch.autograd.grad`` for the gradient of every trainable
parameter: the result is a mapping the caller keeps (``gradient_report(model, grads=...)``
reads it), and no parameter's ``.grad`` is read or written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .findings import InspectorError
from .models import call_model

Progress = Callable[[str], None]


@dataclass(frozen=True)
class LossGradients:
    """The gradients of one loss, by parameter name (the name ``parameters()`` keeps).

    ``grads`` holds a tensor for every trainable parameter the loss reached and ``None`` for
    the ones it did not; frozen parameters are left out.
    """

    loss: float
    batch_size: int
    grads: Mapping[str, torch.Tensor | None] = field(repr=False)
    with_gradient: int
    without_gradient: int
    frozen: int
    seconds: float

    @property
    def message(self) -> str:
        """One line for people: what ran and what it produced."""
        trainable = self.with_gradient + self.without_gradient
        return (f"Ran a backward pass on {self.batch_size} example inputs (loss {self.loss:.6g}) in eval mode in "
                f"{self.seconds:.1f} s: gradients of {self.with_gradient} of {trainable} trainable parameters"
                + (f"; {self.without_gradient} were not reached" if self.without_gradient else "")
                + f". They are kept apart from the model: no .grad was set, and {self.frozen} frozen "
                "parameters, buffers and training flags are as they were.")


def loss_gradients(loaded: Any, batch_size: int = 2, progress: Progress | None = None) -> LossGradients:
    """The gradient of ``loaded``'s loss on its example inputs, for every trainable parameter.

    Runs under the model's lock, in eval mode (dropout off, BatchNorm statistics unchanged),
    restoring every module's training flag afterwards, also when the forward pass raises.
    Uses ``torch.autograd.grad``: the model's ``.grad`` values are neither read nor changed.

    Args:
        loaded: a :class:`~inspector.models.LoadedModel` with example inputs and a loss.
        batch_size: how many examples.
        progress: called with a line of text before the forward and before the backward pass.

    Raises:
        InspectorError: the model is on the meta device, has no loss, or the loss is not a
            scalar that depends on a trainable parameter.

    >>> from inspector.models import load_model
    >>> loaded = load_model("sample:frozen-adapter")
    >>> g = loss_gradients(loaded)
    >>> g.with_gradient, g.frozen, any(p.grad is not None for p in loaded.model.parameters())
    (6, 6, False)
    """
    say = progress or (lambda _line: None)
    model: nn.Module = loaded.model
    loaded.check_runnable()
    if not loaded.has_loss:
        raise InspectorError(f"model {loaded.name!r} defines no loss, so there is nothing to run "
                             "backward on; a Python model file can define loss(outputs, inputs)")
    named = list(model.named_parameters())
    trainable = [(n, p) for n, p in named if p.requires_grad]
    with loaded.lock:
        modes = {m: m.training for m in model.modules()}
        start = time.perf_counter()
        try:
            model.eval()
            inputs = loaded.example_inputs(batch_size)
            say(f"Forward pass and loss on {batch_size} example inputs…")
            with torch.enable_grad():
                loss = loaded.loss(call_model(model, inputs), inputs)
                if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                    shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
                    raise InspectorError(f"the loss of {loaded.name!r} is not a scalar ({shape}); "
                                         "reduce it (e.g. .mean()) in loss(outputs, inputs)")
                if not loss.requires_grad or not trainable:
                    raise InspectorError(f"the loss of {loaded.name!r} does not depend on any parameter "
                                         "that requires a gradient; nothing to run backward on")
                say(f"Backward pass: gradients of {len(trainable)} trainable parameters…")
                grads = torch.autograd.grad(loss.reshape(()), [p for _, p in trainable], allow_unused=True)
        finally:
            for m, was_training in modes.items():
                m.training = was_training
        seconds = time.perf_counter() - start
    mapping = {n: g for (n, _), g in zip(trainable, grads)}
    reached = sum(g is not None for g in grads)
    return LossGradients(float(loss.detach()), batch_size, mapping, reached, len(trainable) - reached,
                         len(named) - len(trainable), seconds)
