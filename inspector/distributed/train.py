"""Run a few training steps of a model under torch.distributed, checking every step.

Used by ``python -m inspector distributed``; every rank runs the same code (``torchrun``
starts them). Without ``torchrun`` it runs as a world of one process.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from ..utils.findings import InspectorError
from .check import TIMEOUT, StepCheck, check_step
from .groups import release_wrapper

SHARD_MODES = ("fsdp", "ddp", "none")


def rank_device(device: str) -> torch.device:
    """``cuda`` becomes this rank's GPU (``LOCAL_RANK``); anything else is kept."""
    if device == "cuda":
        index = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device(device)


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    """The submodules to shard one by one: ``model.fsdp_units()`` if it has it, else every
    member of every ``nn.ModuleList`` (transformer blocks)."""
    units = getattr(model, "fsdp_units", None)
    if callable(units):
        return list(units())
    return [m for mod in model.modules() if isinstance(mod, nn.ModuleList) for m in mod]


def shard(model: nn.Module, mode: str, device: torch.device | str) -> nn.Module:
    """``model`` sharded with FSDP2 (in place), wrapped in DDP, or as it is; ``device`` is this rank's
    (``torch.device("cuda", 1)``, or as text: ``"cpu"``, ``"cuda:1"``)."""
    if mode not in SHARD_MODES:
        raise InspectorError(f"--shard {mode!r}: choose one of {', '.join(SHARD_MODES)}")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError):
        raise InspectorError(f"device {device!r} is not a device torch knows (cpu, cuda, cuda:1...)"
                             ) from None
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for unit in fsdp_units(model):
            fully_shard(unit)
        fully_shard(model)
        return model
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    return model


@contextlib.contextmanager
def sharded(model: nn.Module, mode: str, device: torch.device | str) -> Iterator[nn.Module]:
    """:func:`shard` for the length of a ``with`` block; on exit the wrapper lets go of the process
    group (:func:`release_wrapper`), so the group is never freed with the wrapper."""
    wrapped = shard(model, mode, device)
    try:
        yield wrapped
    finally:
        release_wrapper(wrapped)


def _forward_backward(model: nn.Module, inputs: Any, loss_fn: Callable[[Any, Any], torch.Tensor],
                      step: int) -> torch.Tensor:
    """One forward pass, loss and backward pass; an error names this rank and where it came from."""
    from ..loading.models import call_model

    rank = dist.get_rank() if dist.is_initialized() else 0
    try:
        loss = loss_fn(call_model(model, inputs), inputs)
        loss.backward()
    except InspectorError:
        raise
    except dist.DistError as exc:  # a collective inside FSDP/DDP failed: another rank stopped
        raise InspectorError(f"rank {rank} lost another rank during the forward/backward pass of step {step} "
                             f"({type(exc).__name__}: {_first_line(exc)}); the other ranks' messages say "
                             "which one stopped and why") from exc
    except Exception as exc:  # noqa: BLE001 - the user's model: named as such, not as a bug of ours
        raise InspectorError(
            f"rank {rank}: the model's forward pass or loss raised at step {step}: "
            f"{type(exc).__name__}: {_first_line(exc)}. The error is in the model file, not in "
            "the check; run the model on one process to debug it"
        ) from exc
    return loss


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def train_and_check(
    model: nn.Module,
    inputs_fn: Callable[[int], Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    steps: int,
    path: str | None,
    *,
    batch_size: int = 2,
    lr: float = 1e-2,
    device: torch.device | str = "cpu",
    note: str = "",
    after_backward: Callable[[nn.Module, int], None] | None = None,
    timeout: float = TIMEOUT,
) -> list[StepCheck]:
    """``steps`` SGD steps of ``loss_fn(model(x), x)``, calling :func:`check_step` after each backward.

    ``after_backward(model, step)``, if given, runs between the backward pass and the check;
    ``timeout`` is :func:`check_step`'s.

    Raises:
        InspectorError: the model's forward pass, loss or backward pass raised on this rank (the
            message names the rank and the step), or another rank did not reach a check in time.
    """
    from ..loading.models import to_device

    device = torch.device(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    checks = []
    for step in range(steps):
        inputs = to_device(inputs_fn(batch_size), device)
        loss = _forward_backward(model, inputs, loss_fn, step)
        if after_backward is not None:
            after_backward(model, step)
        checks.append(check_step(model, step, path, note=note, loss=loss, timeout=timeout))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return checks
