"""A backward pass on a model's example inputs: into ``.grad`` when asked, or kept apart.

:func:`run_backward` sets the parameters' ``.grad`` (the one change the inspector makes to a
model, and only when asked). A model shared by several users (one cached model on a
dashboard server) must not carry one user's gradients into another user's view:
:func:`loss_gradients` asks ``torch.autograd.grad`` for the gradient of every trainable
parameter instead and returns a mapping the caller keeps (``gradient_report(model,
grads=...)`` reads it); no parameter's ``.grad`` is read or written.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ..inventory import tensor_inventory
from ..utils.findings import InspectorError
from ..utils.forward_state import module_state_kept
from ..utils.locks import model_lock

Progress = Callable[[str], None]


@contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode for the block (dropout off, BatchNorm statistics unchanged); every module's
    ``training`` flag, the attributes and buffers its forward rebinds or writes are restored
    afterwards, also when the block raises."""
    named = list(model.named_modules())
    modes = {m: m.training for _, m in named}
    with module_state_kept(named):
        try:
            model.eval()
            yield
        finally:
            for m, was_training in modes.items():
                m.training = was_training


def _require_loss(loaded: Any) -> None:
    loaded.check_runnable()
    if not loaded.has_loss:
        raise InspectorError(f"model {loaded.name!r} defines no loss, so there is nothing to run "
                             "backward on; a Python model file can define loss(outputs, inputs)")


def _check_loss(loaded: Any, loss: Any, reaches_trainable: bool = True) -> None:
    """Refuse a loss that is not a scalar or does not depend on a trainable parameter."""
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise InspectorError(f"the loss of {loaded.name!r} is not a scalar ({shape}); "
                             "reduce it (e.g. .mean()) in loss(outputs, inputs)")
    if not loss.requires_grad or not reaches_trainable:
        raise InspectorError(f"the loss of {loaded.name!r} does not depend on any parameter "
                             "that requires a gradient; nothing to run backward on")


# --------------------------------------------------------------------------- into .grad


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
        loaded: a :class:`~inspector.loading.models.LoadedModel` with example inputs and a loss.
        batch_size: how many examples.
        accumulate: add to existing gradients instead of dropping them first.

    Raises:
        InspectorError: the model is on the meta device, has no loss, or the loss is not a
            scalar.

    >>> from inspector.loading.models import load_model
    >>> r = run_backward(load_model("sample:frozen-adapter"))
    >>> r.with_gradient, r.frozen
    (6, 6)
    """
    from ..loading.models import call_model, model_code

    model: nn.Module = loaded.model
    _require_loss(loaded)
    with model_lock(model):
        params = [e.tensor for e in tensor_inventory(model, include_buffers=False).unique_entries()]
        replaced = 0
        start = time.perf_counter()
        with _eval_mode(model):
            inputs = loaded.example_inputs(batch_size)
            with torch.enable_grad(), model_code(f"the forward pass of {loaded.name}",
                                                  "fix its forward (or example_inputs) in the model file"):
                outputs = call_model(model, inputs)
            with torch.enable_grad():
                loss = loaded.loss(outputs, inputs)
                _check_loss(loaded, loss)
                if not accumulate:
                    for p in params:
                        if p.grad is not None:
                            replaced += 1
                            p.grad = None
                with model_code(f"the backward pass of {loaded.name}",
                                "fix the loss or the forward in the model file"):
                    loss.backward()
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


# --------------------------------------------------------------------------- kept apart


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
        return (
            f"Ran a backward pass on {self.batch_size} example inputs (loss {self.loss:.6g}) in eval mode in "
            f"{self.seconds:.1f} s: gradients of {self.with_gradient} of {trainable} trainable parameters"
            + (f"; {self.without_gradient} were not reached" if self.without_gradient else "")
            + f". They are kept apart from the model: no .grad was set, and {self.frozen} frozen "
            "parameters, buffers and training flags are as they were."
        )


def loss_gradients(loaded: Any, batch_size: int = 2, progress: Progress | None = None) -> LossGradients:
    """The gradient of ``loaded``'s loss on its example inputs, for every trainable parameter.

    Runs under the model's lock, in eval mode (dropout off, BatchNorm statistics unchanged),
    restoring every module's training flag afterwards, also when the forward pass raises.
    Uses ``torch.autograd.grad``: the model's ``.grad`` values are neither read nor changed.

    Args:
        loaded: a :class:`~inspector.loading.models.LoadedModel` with example inputs and a loss.
        batch_size: how many examples.
        progress: called with a line of text before the forward and before the backward pass.

    Raises:
        InspectorError: the model is on the meta device, has no loss, or the loss is not a
            scalar that depends on a trainable parameter.

    >>> from inspector.loading.models import load_model
    >>> loaded = load_model("sample:frozen-adapter")
    >>> g = loss_gradients(loaded)
    >>> g.with_gradient, g.frozen, any(p.grad is not None for p in loaded.model.parameters())
    (6, 6, False)
    """
    from ..loading.models import call_model

    say = progress or (lambda _line: None)
    model: nn.Module = loaded.model
    _require_loss(loaded)
    named, _ = tensor_inventory(model, include_buffers=False).named_unique()  # named_parameters()
    trainable = [(n, p) for n, p in named if p.requires_grad]
    with loaded.lock:
        start = time.perf_counter()
        with _eval_mode(model):
            inputs = loaded.example_inputs(batch_size)
            say(f"Forward pass and loss on {batch_size} example inputs…")
            with torch.enable_grad():
                loss = loaded.loss(call_model(model, inputs), inputs)
                _check_loss(loaded, loss, reaches_trainable=bool(trainable))
                say(f"Backward pass: gradients of {len(trainable)} trainable parameters…")
                grads = torch.autograd.grad(loss.reshape(()), [p for _, p in trainable], allow_unused=True)
        seconds = time.perf_counter() - start
    mapping = {n: g for (n, _), g in zip(trainable, grads, strict=True)}
    reached = sum(g is not None for g in grads)
    return LossGradients(float(loss.detach()), batch_size, mapping, reached, len(trainable) - reached,
                         len(named) - len(trainable), seconds)
