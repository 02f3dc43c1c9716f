"""The hooks of a capture: one copy and an O(1) record per selected module output.

Each module of the model gets one forward hook for the capture (the unselected ones only
watch for in-place writes); names are resolved once per capture, statistics are computed
after the pass, and values are compared only where a storage was written in place (see
:mod:`.watch`).

The hooks are the model's own, not one process-wide module hook: another model's pass in
another thread (another session of a server) never meets them, only the model's own hook
dictionaries change (a failing pass elsewhere never sees torch's dictionary of process-wide
hooks change size under it), and a model compiled elsewhere is not recompiled for them.
Registering and removing them costs about 3 us per module per capture; measured against one
process-wide hook (``benchmarks/bench_capture_hooks.py``, docs/performance.md) that is within
the noise on gpt2-small and 2-11% of a capture of a 371-module Llama of width 64 on one CPU
thread, where the process-wide hook slowed another model's pass by 3-9% meanwhile.

A module's hook is registered after the hooks it already has, as the last one: what is
captured is what the module returned to its caller (a user's hook may replace the output or
write it in place), and the user's hooks are not taken for in-place writers. Every hook is
removed when the capture ends; the user's hooks stay the same objects in the same order.

The hooks act only in the thread that started the capture (``threading.get_ident()``): a
pass of the same model in another thread returns at once, with its outputs, hooks and
gradients what they would be without the capture. They accept being called without
``kwargs``: a pass in another thread can call one between torch adding it and marking it as
taking ``kwargs``.

Copies are plain tensors also when the pass runs in inference mode: the hook leaves inference
mode around the copy with ``torch.inference_mode(False)`` (reused contexts: making one costs
more than entering it). With ``watch_mutations=False`` nothing is watched and copies made in
inference mode stay inference tensors: the cheapest capture, for very deep models.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..utils.findings import Finding, InspectorError
from ..utils.labels import module_label
from ..utils.units import format_bytes
from .budget import BUDGET, budget_findings, check_budget
from .leaves import KEEP_AS_IS, flat, leaf_paths, tensor_leaves, unflat
from .results import Captures, Mutation, Skipped
from .storage import MEMCPY_BYTES, Storage
from .watch import Watcher, live_record, storage_key

_SKIP = object()
_WATCH_OFF = ("in-place writes to the captured outputs were not watched (watch_mutations=False): "
              ".mutated is empty because it was not checked, not because nothing was overwritten")


@dataclass(frozen=True)
class Options:
    """What a capture keeps, as given to :func:`~inspector.capture.capture_activations`."""

    store_on: torch.device
    max_bytes: int | None = None
    grads: bool = False
    keep_inputs: bool = False
    keep_references: bool = False
    watch_mutations: bool = True

    @property
    def fast(self) -> bool:
        """Whether a plain CPU tensor output can take the short path: one copy, one record."""
        return self.store_on.type == "cpu" and self.max_bytes is None and not (
            self.keep_inputs or self.keep_references or self.grads)


class Recorder:
    """Hooks on every module; copies what is selected, watches what was copied."""

    def __init__(self, named: list[tuple[str, nn.Module]], selected: dict[str, nn.Module],
                 options: Options) -> None:
        check_budget(options.max_bytes)
        if options.store_on.type == "meta":
            raise InspectorError("store_on='meta' would keep no values; choose cpu or a GPU")
        self.named = named
        self.selected_ids = {id(m) for m in selected.values()}
        self.options = options
        self.storage = Storage(options.store_on)
        self.watcher = Watcher()
        self.watch = options.watch_mutations  # False: no watch, copies made in inference mode stay so
        # what the capture collects; :meth:`finish` builds the frozen :class:`Captures` from it
        self.outputs: dict[str, Any] = {}
        self.inputs: dict[str, Any] = {}
        self.grads: dict[str, Any] = {}
        self.order: list[str] = []
        self.skipped: list[Skipped] = []
        self.references: dict[str, Any] = {}
        self.mutated: dict[str, str | None] = {}
        self.mutations: list[Mutation] = []
        self.findings: list[Finding] = []
        self.closed = False
        self.ident = threading.get_ident()
        self.used = 0
        self.full = False
        self.calls: dict[str, int] = {}
        self.pending: dict[str, list[str]] = {}   # keys given by pre-hooks (keep_inputs)
        self.handles: list[Any] = []
        self.grad_handles: list[Any] = []
        self.grad_lock = threading.Lock()
        self.training = [(m, m.training) for _, m in named]

    # hooks ----------------------------------------------------------------------------

    def attach(self) -> None:
        """A forward hook on every module of the model, after the module's own hooks (a
        pre-hook too on the selected ones when inputs are kept)."""
        table: dict[int, tuple[str, bool]] = {}
        hook = self._hook(table)
        handles, keep_inputs = self.handles, self.options.keep_inputs
        for name, module in self.named:
            if id(module) in table:
                continue
            capture = id(module) in self.selected_ids
            table[id(module)] = (module_label(name), capture)
            if capture and keep_inputs:
                handles.append(module.register_forward_pre_hook(self._pre_hook(module_label(name)),
                                                                with_kwargs=True))
            handles.append(module.register_forward_hook(hook, with_kwargs=True))

    def where(self, exc: BaseException) -> str | None:
        """The innermost module of the model whose forward the exception went through."""
        names = {id(m): module_label(n) for n, m in self.named}
        found = None
        tb = exc.__traceback__
        while tb is not None:
            owner = tb.tb_frame.f_locals.get("self")
            if owner is not None and id(owner) in names:
                found = names[id(owner)]
            tb = tb.tb_next
        return found

    def _key(self, name: str) -> str:
        count = self.calls.get(name, 0) + 1
        self.calls[name] = count
        return name if count == 1 else f"{name}#{count}"

    def _pre_hook(self, name: str) -> Callable:
        ident = self.ident

        def pre_hook(module: nn.Module, args: Any, kwargs: Any = None) -> None:
            # kwargs has a default: another thread's forward can run while torch registers this
            # hook, between adding it and marking it as taking kwargs, and call it without them.
            if threading.get_ident() != ident:
                return
            # before the module runs: an in-place module changes its input
            key = self._key(name)
            self.pending.setdefault(name, []).append(key)
            kwargs = kwargs or {}
            value = args[0] if len(args) == 1 and not kwargs else (
                tuple(args) if not kwargs else {"args": tuple(args), "kwargs": dict(kwargs)})
            plain = self.watch and torch.is_inference_mode_enabled()
            with torch.inference_mode(False) if plain else nullcontext():
                stored = self._store(key, "input", value, watch=False)
            if stored is not _SKIP:
                self.inputs[key] = stored
        return pre_hook

    def _hook(self, table: dict[int, tuple[str, bool]]) -> Callable:
        ident, get_ident, tensor = self.ident, threading.get_ident, torch.Tensor
        watcher, by_storage = self.watcher, self.watcher.by_storage
        inference, outside = torch.is_inference_mode_enabled, torch.inference_mode
        take = self._short if self.options.fast else self._take
        plain = self.watch  # copies made in inference mode leave it, unless the watch is off
        # contexts that leave inference mode, reused: making one costs more than using it; one
        # is taken off the list for each use, so a nested use never enters one twice
        spare = [outside(False)]

        def hook(module: nn.Module, args: Any, *kwargs_output: Any) -> None:
            # kwargs may be missing: see pre_hook. Other threads' passes through the model pass through.
            if get_ident() != ident or (entry := table.get(id(module))) is None:
                return
            name, capture = entry
            output = kwargs_output[-1]
            if by_storage:
                if watcher.versioned or type(output) is not tensor:
                    watcher.touched(name, args, kwargs_output[0] if len(kwargs_output) == 2 else None, output)
                elif storage_key(output) in by_storage:
                    watcher.touched(name, args, None, output)  # only outputs are watched here: O(1)
            if not capture:
                return
            if plain and inference():  # copies are plain tensors, also when the pass runs in inference mode
                leave = spare.pop() if spare else outside(False)
                with leave:
                    take(name, output)
                spare.append(leave)
            else:
                take(name, output)
        return hook

    def _take(self, name: str, output: Any) -> None:
        pending = self.pending.get(name) if self.options.keep_inputs else None
        self._capture(pending.pop() if pending else self._key(name), output)

    def _short(self, name: str, output: Any) -> None:
        """The common case: a small plain CPU tensor (or a flat tuple or list of them) copied to
        the CPU with no budget, inputs, references or gradients to look after: one copy, one
        record per tensor. Anything else goes the long way (:meth:`_take`)."""
        tensor = torch.Tensor
        single = type(output) is tensor
        leaves = (output,) if single else output if type(output) in (tuple, list) else ()
        tensors = 0
        for t in leaves:
            if t is None:
                continue
            tensors += 1
            if not (type(t) is tensor and t.is_cpu and t.layout == torch.strided and not t.is_quantized
                    and t.nbytes < MEMCPY_BYTES):
                return self._take(name, output)
        if not tensors:
            return self._take(name, output)
        calls = self.calls
        if name in calls:
            key = self._key(name)
        else:
            calls[name] = 1
            key = name
        copies, watch = [], self.watch
        for i, t in enumerate(leaves):
            if t is None:
                copy = None
            else:  # detached only where it takes part in autograd (a detach costs as much as a check)
                copy = (t.detach() if t.requires_grad else t).clone(memory_format=torch.contiguous_format)
            copies.append(copy)
            if watch and copy is not None and t.numel():
                self.watcher.add(live_record(key, "" if single else f"[{i}]", t, copy),
                                 t.untyped_storage().data_ptr(), t)
        self.outputs[key] = copies[0] if single else type(output)(copies)
        self.order.append(key)

    def _capture(self, key: str, output: Any) -> None:
        stored = self._store(key, "output", output, watch=self.watch)
        if stored is not _SKIP:
            self.outputs[key] = stored
            self.order.append(key)
            if self.options.keep_references:
                self.references[key] = output
            if self.options.grads:
                self._grad_hooks(key, output)

    def _fits(self, key: str, kind: str, path: str, nbytes: int) -> bool:
        """Count ``nbytes`` against the budget; False (and a Skipped record) when over it."""
        limit = self.options.max_bytes
        if self.full or (limit is not None and self.used + nbytes > limit):
            self.full = True
            self.skipped.append(Skipped(key, kind, path, nbytes, f"{BUDGET} ({format_bytes(self.used)} "
                                        f"of {format_bytes(limit)} used)"))
            return False
        self.used += nbytes
        return True

    def _store(self, key: str, kind: str, value: Any, watch: bool) -> Any:
        """A copy of ``value`` leaf by leaf, or _SKIP (and a Skipped record)."""
        leaves, spec, paths = flat(value)
        tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
        if not tensors:
            if kind == "output":
                self.skipped.append(Skipped(key, kind, "", 0, f"the {kind} is a "
                                            f"{type(value).__name__}, not a tensor or a "
                                            "structure holding tensors"))
            return _SKIP
        if not self._fits(key, kind, "", sum(t.numel() * t.element_size() for t in tensors)):
            return _SKIP
        if paths is None:
            paths = leaf_paths(value, spec)
        return unflat(
            [
                self._store_leaf(key, kind, path, leaf, watch)
                for path, leaf in zip(paths, leaves, strict=True)
            ],
            spec,
        )

    def _store_leaf(self, key: str, kind: str, path: str, leaf: Any, watch: bool) -> Any:
        if isinstance(leaf, torch.Tensor):
            copy = self.storage.copy(leaf)
            if copy is None:
                self.skipped.append(Skipped(key, kind, path, 0, "a meta tensor has no values"))
            elif watch:
                self.watcher.track(key, path, leaf, copy)
            return copy
        if isinstance(leaf, KEEP_AS_IS):
            return leaf
        self.skipped.append(Skipped(key, kind, path, 0, f"a {type(leaf).__name__} is not "
                                    "a tensor; it was left out (None in its place)"))
        return None

    def _grad_hooks(self, key: str, output: Any) -> None:
        items = [("", output)] if isinstance(output, torch.Tensor) else list(tensor_leaves(output))
        for path, t in items:
            if t.requires_grad:
                single = len(items) == 1 and path == ""
                self.grad_handles.append(t.register_hook(self._grad_hook(key, path, single)))

    def _grad_hook(self, key: str, path: str, single: bool) -> Callable:
        def hook(grad: torch.Tensor) -> None:
            with self.grad_lock:
                if not self._fits(key, "grad", path, grad.numel() * grad.element_size()):
                    return
                copy = self.storage.copy(grad)
                if single:
                    self.grads[key] = copy
                else:
                    self.grads.setdefault(key, {})[path] = copy
        return hook

    # end ------------------------------------------------------------------------------

    def detach(self) -> None:
        """Remove the forward hooks and put every module's ``training`` flag back."""
        for h in self.handles:
            h.remove()
        self.handles.clear()
        for m, training in self.training:
            if m.training != training:
                m.train(training)

    def close(self) -> None:
        """Remove the gradient hooks, wait for the copies, settle mutations, add the findings
        of the capture itself. Called once, also when the pass raised."""
        if self.closed:
            return
        self.closed = True
        for h in self.grad_handles:
            h.remove()
        self.grad_handles.clear()
        self.storage.finish()
        self.watcher.settle(self.mutated, self.mutations, self.findings)
        self.findings.extend(budget_findings(self.skipped, self.options.max_bytes))
        if not self.watch:
            self.findings.append(Finding("mutation-watch-off", "info", "", _WATCH_OFF))

    def finish(self, findings: list[Finding] | None = None, model_output: Any = None,
               placements: dict[str, str] | None = None) -> Captures:
        """The frozen :class:`Captures` of what was collected (after :meth:`close`), with the
        caller's own ``findings`` last, the ``model_output`` and the tensor-parallel ``placements``."""
        self.close()
        return self._build(findings, model_output, placements)

    def snapshot(self) -> Captures:
        """What was collected so far, as a :class:`Captures` of copies (read inside a block)."""
        return self._build(None, None, None)

    def _build(self, findings: list[Finding] | None, model_output: Any,
               placements: dict[str, str] | None) -> Captures:
        return Captures(
            outputs=dict(self.outputs),
            inputs=dict(self.inputs),
            grads=dict(self.grads),
            mutated=dict(self.mutated),
            mutations=list(self.mutations),
            skipped=list(self.skipped),
            references=dict(self.references),
            order=list(self.order),
            findings=[*self.findings, *(findings or ())],
            store_on=str(self.options.store_on),
            model_output=model_output,
            placements=dict(placements or {}),
            mutations_watched=self.watch,
        )
