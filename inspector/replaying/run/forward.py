"""The kept step's forward calls run again as they began: the kept weights in the model's own tensors,
the generators, autocast and the modules' modes set per call, forward then backward; the weights, the
gradients and the version counters put back afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import torch
from torch import nn

from ...utils.findings import InspectorError
from ..calls import as_inputs, rebuild
from ..files import KeptStep, ReplayFile


@contextmanager
def _weights_in(model: nn.Module, f: ReplayFile, step: int) -> Iterator[None]:
    """The kept weights in the model's own tensors (in place) and no gradients; all put back after."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    kept_w, kept_b = f.tensors(f"s{step}/w/"), f.tensors(f"s{step}/b/")
    saved = {n: p.detach().clone() for n, p in params.items()}
    saved_b = {n: b.detach().clone() for n, b in buffers.items()}
    grads = {n: p.grad for n, p in params.items()}
    try:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(kept_w[n])
                p.grad = None
            for n, b in buffers.items():
                b.copy_(kept_b[n])
        yield
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved[n])
                p.grad = grads[n]
            for n, b in buffers.items():
                b.copy_(saved_b[n])


@contextmanager
def versions_kept(root: nn.Module) -> Iterator[None]:
    """The version counters of ``root``'s parameters and buffers set back to what they were when the
    block ends (the replay writes each twice: the kept weights in, the model's own back). Where torch
    cannot set them (a torch without ``_unsafe_set_version_counter``), they are left moved."""
    tensors, versions = [], []
    for t in (*root.parameters(), *root.buffers()):
        try:
            versions.append(int(t._version))
        except RuntimeError:  # an inference tensor has no version counter
            continue
        tensors.append(t)
    try:
        yield
    finally:
        setter = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)
        if setter is not None and tensors:
            try:
                setter(tuple(tensors), tuple(versions))
            except TypeError:  # torch before 2.5: one tensor a call
                for t, v in zip(tensors, versions, strict=True):
                    setter(t, v)


def _default_loss(outputs: Any, inputs: Any) -> torch.Tensor | None:
    loss = getattr(outputs, "loss", None)
    if loss is None and isinstance(outputs, dict):
        loss = outputs.get("loss")
    if loss is None and isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
        loss = outputs.reshape(())
    return loss if isinstance(loss, torch.Tensor) else None


def _replay_calls(
    model: nn.Module, f: ReplayFile, kept: KeptStep, loss_fn: Callable | None, named: dict[str, nn.Module]
) -> list[float]:
    """Each kept call of the step, forward then backward, as it began then; the losses."""
    losses = []
    for i, call in enumerate(kept.calls):
        tensors = f.tensors(f"s{kept.step}/c{i}/")
        tensors = {f"s{kept.step}/c{i}/{k}": t for k, t in tensors.items()}
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        args = _to(rebuild(call.args, tensors, f.path.name), device)
        kwargs = _to(rebuild(call.kwargs, tensors, f.path.name), device)
        if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
            raise InspectorError(
                f"{f.path.name}: a call's arguments are not a list and a dict; the file is forged"
            )
        for name, m in named.items():
            m.training = name not in call.eval_modules
        torch.set_rng_state(tensors[call.rng["cpu"]])
        for dev, key in call.rng.items():
            if (
                dev.startswith("cuda")
                and torch.cuda.is_available()
                and int(dev[4:]) < torch.cuda.device_count()
            ):
                torch.cuda.set_rng_state(tensors[key], int(dev[4:]))
        with ExitStack() as amp:
            for dev, dtype in call.autocast.items():
                amp.enter_context(torch.autocast(dev, dtype=getattr(torch, dtype)))
            with torch.enable_grad():
                outputs = model(*args, **kwargs)
                fn = loss_fn or _default_loss
                loss = fn(outputs, as_inputs(tuple(args), kwargs))
        if loss is None:
            continue
        losses.append(float(loss.detach().float()))
        if loss.requires_grad:
            loss.backward()
    return losses


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value
