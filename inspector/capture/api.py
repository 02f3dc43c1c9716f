"""The public entry points: :func:`capturing` (a block) and :func:`capture_activations` (one call).

A forward hook that keeps ``output`` keeps a reference to the live tensor, not a copy.
Anything that later writes into that memory (a following ``ReLU(inplace=True)``, a
residual ``+=``) changes what was "captured", silently. Here every capture is a detached
copy taken inside the hook, and the capture says which live outputs were changed after
the hook saw them (see :mod:`.watch`), so the user knows where a bare reference is wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn

from ..inventory import tensor_inventory
from ..loading.devices import resolve_device
from ..loading.models import call_model
from ..sharding import output_placements, placement_notes
from ..utils.checks import require_module
from ..utils.dtensors import kept_sharded
from ..utils.findings import Finding, InspectorError
from ..utils.forward_state import module_state_kept, restored_message
from ..utils.locks import model_lock
from .leaves import tensor_leaves
from .recorder import Options, Recorder
from .results import Captures
from .select import select_from


class CaptureBlock:
    """What :func:`capturing` yields: it reads as the block's :class:`Captures` once the block
    has ended (``.result`` is that frozen result itself).

    Inside the block, the fields read as a snapshot of what was collected so far; ``stats``,
    ``to_dict()`` and ``result`` are only there after the block.
    """

    __slots__ = ("_recorder", "_result")

    def __init__(self, recorder: Recorder) -> None:
        self._recorder: Recorder | None = recorder
        self._result: Captures | None = None

    def _end(self) -> None:
        if self._recorder is not None:
            self._result = self._recorder.finish()
            self._recorder = None  # the hooks' closures and the watch go with it

    @property
    def result(self) -> Captures:
        """The :class:`Captures` of the block, built when the block ended."""
        if self._result is None:
            raise InspectorError("the captures are complete only when the `with capturing(...)` block "
                                 "ends; read them after the block")
        return self._result

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_recorder", "_result"):
            raise AttributeError(name)
        if self._result is not None:
            return getattr(self._result, name)
        if name in ("stats", "to_dict") or self._recorder is None:
            return getattr(self.result, name)  # raises: not complete yet
        return getattr(self._recorder.snapshot(), name)

    def __repr__(self) -> str:
        return repr(self._result) if self._result is not None else "CaptureBlock(capturing)"


@contextmanager
def capturing(model: nn.Module, modules: Any = None, store_on: str | torch.device = "cpu",
              max_bytes: int | None = None, grads: bool = False, *, keep_inputs: bool = False,
              keep_references: bool = False, watch_mutations: bool = True,
              hold_lock: bool = True) -> Iterator[CaptureBlock]:
    """Capture activations of the forward (and backward) passes run inside the block.

    Only passes run by the thread that entered the block are recorded. The yielded
    :class:`CaptureBlock` reads as the :class:`Captures` built when the block ends. Arguments
    are those of :func:`capture_activations`; ``hold_lock=False`` leaves the model's lock alone
    (the caller then makes sure nothing else adds hooks meanwhile).

    >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    >>> _ = nn.init.constant_(net[0].weight, -1.0)  # outputs below zero: the ReLU changes them
    >>> with capturing(net) as cap:
    ...     _ = net(torch.ones(1, 2))
    >>> sorted(cap.outputs), list(cap.mutated)
    (['0', '1'], ['0'])
    """
    model = require_module(model, "capturing")
    options = Options(resolve_device(store_on), max_bytes, grads, keep_inputs, keep_references,
                      watch_mutations)
    block = None
    try:
        with _recording(model, list(model.named_modules()), modules, options, hold_lock) as rec:
            block = CaptureBlock(rec)
            yield block
    finally:
        if block is not None:
            block._end()  # after the hooks are gone: the frozen result of what was collected


@contextmanager
def _recording(model: nn.Module, named: list[tuple[str, nn.Module]], modules: Any, options: Options,
               hold_lock: bool) -> Iterator[Recorder]:
    selected = select_from(model, named, modules)
    lock = model_lock(model) if hold_lock else None
    if lock is not None:
        lock.acquire()
    rec = None
    try:
        rec = Recorder(named, selected, options)
        try:
            rec.attach()
            yield rec
        except Exception as exc:
            where = rec.where(exc)
            if where and hasattr(exc, "add_note"):
                exc.add_note(f"(raised inside module {where})")
            raise
        finally:
            rec.detach()
            rec.close()
    finally:
        if lock is not None:
            lock.release()


def capture_activations(model: nn.Module, inputs: Any, modules: Any = None,
                        store_on: str | torch.device = "cpu", max_bytes: int | None = None,
                        grads: bool = False, *, keep_inputs: bool = False,
                        keep_references: bool = False, watch_mutations: bool = True,
                        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None) -> Captures:
    """Run ``model`` on ``inputs`` and capture module outputs as detached copies.

    Holds the model's lock; hooks are removed when it returns, also when the forward pass
    raises; the model's own hooks, ``training`` flags, grad mode, buffers and attributes are left
    as they were: what the forward rebinds or writes on its modules (a training-mode BatchNorm's
    running statistics, ``self.calls += 1``) is put back after the pass, with an info finding.

    Args:
        model: the model (not changed).
        inputs: a tensor (``model(x)``), a tuple (``model(*x)``) or a dict (``model(**x)``).
        modules: ``None`` for every submodule, or names, glob patterns, classes (see
            :func:`select_modules`).
        store_on: where the copies go: ``"cpu"`` (pinned, non-blocking from CUDA) or a device.
        max_bytes: stop capturing at this many bytes; what did not fit is in ``.skipped``.
        grads: also capture the gradient of each selected output. Runs a backward pass with
            ``torch.autograd.grad``, so no parameter's ``.grad`` changes.
        keep_inputs: also capture module inputs.
        keep_references: also keep the bare live outputs (``.references``): what a naive hook saw.
        watch_mutations: ``False`` skips the watch for in-place writes, for the cheapest capture
            of a very deep model: ``.mutated`` and ``.mutations`` stay empty because nothing was
            checked (``.mutations_watched`` is False, with a ``mutation-watch-off`` info finding),
            and under ``torch.inference_mode()`` the copies stay inference tensors (not to be
            written in place or used in autograd outside it). Outputs, stats and skips are the same.
        loss_fn: ``loss_fn(outputs, inputs)`` for ``grads=True``; default: sum of float outputs.

    Returns:
        Captures with ``.outputs``, ``.mutated``, ``.stats``, ``.skipped``.

    Raises:
        InspectorError: unknown module names, a negative budget, a forward pass that fails
            (naming the module that raised).

    >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    >>> _ = nn.init.constant_(net[0].weight, -1.0)  # outputs below zero: the ReLU changes them
    >>> cap = capture_activations(net, torch.ones(1, 2), modules="0")
    >>> cap.outputs["0"].shape, cap.mutated
    (torch.Size([1, 2]), {'0': '1'})
    >>> cap = capture_activations(net, torch.ones(1, 2), modules="0", watch_mutations=False)
    >>> cap.mutated, cap.mutations_watched, [f.code for f in cap.findings]
    ({}, False, ['mutation-watch-off'])
    """
    model = require_module(model, "capture_activations")
    if grads and torch.is_inference_mode_enabled():
        raise InspectorError("grads=True needs autograd, which inference mode turns off; call "
                             "capture_activations outside torch.inference_mode()")
    named = list(model.named_modules())  # the one walk of this call
    options = Options(resolve_device(store_on), max_bytes, grads, keep_inputs, keep_references,
                      watch_mutations)
    with _recording(model, named, modules, options, True) as rec, output_placements(named) as placed, \
            module_state_kept(named) as restored, kept_sharded(model, [m for _, m in named]):
        try:
            with torch.enable_grad() if grads else nullcontext():
                output = call_model(model, inputs)
                if grads:
                    _backward(model, output, inputs, loss_fn, rec.findings)
        except InspectorError:
            raise
        except Exception as exc:
            where = rec.where(exc)
            raise InspectorError(f"the forward pass of {type(model).__name__} failed"
                                 f"{' in module ' + where if where else ''}: "
                                 f"{type(exc).__name__}: {exc}") from exc
    restored_findings = (
        [Finding("forward-state-restored", "info", "", restored_message(restored))] if restored else []
    )
    notes, shard_findings = placement_notes(
        placed, rec.outputs
    )  # tensor parallel: which piece each capture is
    return rec.finish([*restored_findings, *shard_findings], model_output=output, placements=notes)


def _backward(model: nn.Module, output: Any, inputs: Any,
              loss_fn: Callable[[Any, Any], torch.Tensor] | None, findings: list[Finding]) -> None:
    if loss_fn is not None:
        loss = loss_fn(output, inputs)
    else:
        parts = [t.float().sum() for _, t in tensor_leaves(output) if t.is_floating_point()]
        if not parts:
            raise InspectorError("grads=True needs a floating-point model output or a loss_fn")
        loss = torch.stack(parts).sum()
    wrt = [
        e.tensor for e in tensor_inventory(model, include_buffers=False).unique_entries() if e.requires_grad
    ]
    if not loss.requires_grad or not wrt:
        findings.append(Finding("capture-no-grads", "warning", "",
                                "no gradients were captured: no parameter requires grad, so "
                                "the loss does not depend on anything trainable"))
        return
    torch.autograd.grad(loss, wrt, allow_unused=True)
