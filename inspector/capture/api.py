"""Activation capture as detached clones, with in-place mutation detection.

A forward hook that keeps ``output`` keeps a reference to the live tensor, not a copy.
Anything that later writes into that memory (a following ``ReLU(inplace=True)``, a
residual ``+=``) changes what was "captured", silently. Here every capture is a
detached copy taken inside the hook, and the capture says which live outputs were
changed after the hook saw them, so the user knows where a bare reference is wrong.

Outside inference mode the tensor version counter tells when a live output was
written in place (checked after every module and at the end of the pass). Inference
tensors have no version counter; there a live output is compared with its copy when a
later module returns a tensor on the same storage (which is how in-place writers such as
``ReLU(inplace=True)`` or a returned residual ``x += ...`` show themselves), and it is
held only weakly, so capturing in inference mode keeps no activation alive longer.

Each copy is its own tensor (pinned when it comes from a GPU): no memory is held once
the captures that use it are gone. Per module the hooks do one copy and an O(1) record;
names are resolved once per call, statistics are computed after the pass, and values
are compared only where a storage was written in place.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.utils._pytree as pytree
from torch import nn

from .checks import require_module
from .devices import resolve_device
from .distributed.tensors import kept_sharded
from .findings import Finding, InspectorError
from .locks import model_lock
from .models import call_model

STATS_COLUMNS = ["module", "kind", "path", "shape", "dtype", "device", "bytes", "mean", "std", "min",
                 "max", "nan", "inf", "zero_fraction", "mutated"]
SKIPPED_COLUMNS = ["module", "kind", "path", "bytes", "reason"]
_KEEP_AS_IS = (type(None), bool, int, float, complex, str, torch.Size, torch.dtype, torch.device)


@dataclass(frozen=True)
class Skipped:
    """Something that was not captured, and why.

    ``kind`` is ``"output"``, ``"input"`` or ``"grad"``; ``path`` names the leaf inside a
    structured output (``""`` for the whole value); ``bytes`` is its size (0 if unknown).
    """

    module: str
    kind: str
    path: str
    bytes: int
    reason: str


@dataclass(frozen=True)
class Mutation:
    """A live module output that changed after its capture.

    ``by`` is the module after whose forward the change was first seen (``None`` if it
    happened outside any module or could not be told); ``how`` is ``"version"`` (the
    version counter moved) or ``"value"`` (inference tensors: compared with the copy).
    """

    module: str
    path: str
    by: str | None
    how: str
    max_abs_change: float | None


@dataclass(frozen=True, eq=False)
class Captures:
    """What :func:`capture_activations` recorded.

    Attributes:
        outputs: module name -> detached copy of its output, structure kept (tuples,
            lists, dicts, Hugging Face model outputs). A module called twice in one
            forward pass gives ``name`` and ``name#2``.
        inputs: the same for module inputs (only with ``keep_inputs=True``).
        grads: module name -> copy of the gradient of its output (``grads=True``).
        mutated: module name -> what overwrote its live output (the next module that ran,
            or ``None`` when that cannot be told).
        mutations: one :class:`Mutation` per changed tensor leaf.
        skipped: what the byte budget or non-tensor outputs left out, with sizes.
        references: module name -> the bare live output a naive hook would have kept
            (only with ``keep_references=True``, for teaching).
        order: capture keys in the order the modules ran.
        findings: problems worth telling the user.
        store_on: where the copies live.
        model_output: what the forward pass returned (functional form only).
    """

    outputs: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    grads: dict[str, Any] = field(default_factory=dict)
    mutated: dict[str, str | None] = field(default_factory=dict)
    mutations: list[Mutation] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    references: dict[str, Any] = field(default_factory=dict, repr=False)
    order: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    store_on: str = "cpu"
    model_output: Any = field(default=None, repr=False, compare=False)
    _state: dict[str, Any] = field(default_factory=lambda: {"done": False}, repr=False, compare=False)

    def _require_done(self) -> None:
        if not self._state["done"]:
            raise InspectorError("the captures are complete only when the `with capturing(...)` block "
                                 "ends; read them after the block")

    @cached_property
    def stats(self) -> pd.DataFrame:
        """One row per captured tensor leaf: module, kind, path, shape, dtype, device, bytes,
        mean, std, min, max, nan, inf, zero_fraction, mutated."""
        self._require_done()
        rows = []
        for kind, store in (("output", self.outputs), ("input", self.inputs), ("grad", self.grads)):
            for module, value in store.items():
                for path, t in _tensor_leaves(value):
                    rows.append({"module": module, "kind": kind, "path": path, **tensor_stats(t),
                                 "mutated": kind == "output" and module in self.mutated})
        return pd.DataFrame(rows, columns=STATS_COLUMNS)

    @property
    def skipped_table(self) -> pd.DataFrame:
        """``skipped`` as a DataFrame (module, kind, path, bytes, reason)."""
        return pd.DataFrame([s.__dict__ for s in self.skipped], columns=SKIPPED_COLUMNS)

    @property
    def total_bytes(self) -> int:
        """Bytes held by the copies (outputs, inputs and grads)."""
        return sum(t.numel() * t.element_size() for store in (self.outputs, self.inputs, self.grads)
                   for v in store.values() for _, t in _tensor_leaves(v))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe summary: stats rows, mutated modules, skipped items, findings (no tensors)."""
        self._require_done()
        return {
            "store_on": self.store_on,
            "modules": list(self.order),
            "bytes": self.total_bytes,
            "stats": [{k: _json_value(v) for k, v in row.items()}
                      for row in self.stats.to_dict("records")],
            "mutated": dict(self.mutated),
            "mutations": [{**m.__dict__, "max_abs_change": _json_value(m.max_abs_change)}
                          for m in self.mutations],
            "skipped": [s.__dict__.copy() for s in self.skipped],
            "findings": [f.to_dict() for f in self.findings],
        }


def _json_value(v: Any) -> Any:
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _tensor_leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor inside a structured value."""
    if isinstance(value, torch.Tensor):
        yield prefix, value
        return
    leaves, _ = pytree.tree_flatten_with_path(value)
    for keypath, leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            yield prefix + pytree.keystr(keypath), leaf


def tensor_stats(t: torch.Tensor) -> dict[str, Any]:
    """Shape, dtype, device, bytes and value statistics of one tensor.

    Mean, std, min and max are over the finite values; ``nan``/``inf`` count the others.

    >>> s = tensor_stats(torch.tensor([0.0, 2.0, float("nan")]))
    >>> s["mean"], s["nan"], s["zero_fraction"]
    (1.0, 1, 0.3333333333333333)
    """
    n = t.numel()
    row: dict[str, Any] = {"shape": str(tuple(t.shape)), "dtype": str(t.dtype).removeprefix("torch."),
                           "device": str(t.device), "bytes": n * t.element_size(), "mean": None,
                           "std": None, "min": None, "max": None, "nan": 0, "inf": 0,
                           "zero_fraction": None}
    if n == 0 or t.device.type == "meta":
        return row
    x = t.detach()
    if x.is_complex():
        x = x.abs()
    x = x.double() if not x.is_floating_point() or x.dtype == torch.float64 else x.float()
    flat = x.reshape(-1)
    total = flat.sum()
    if bool(torch.isfinite(total)):  # a NaN or Inf anywhere would make the sum non-finite
        nan = inf = 0
        zeros = n - int(torch.count_nonzero(flat))
        mean = float(total) / n
        mean_sq = float(torch.dot(flat, flat)) / n  # one pass each, no temporaries
        var = mean_sq - mean * mean
        if math.isfinite(mean_sq) and var > 1e-3 * mean_sq:
            std = math.sqrt(var)
        else:  # heavy cancellation (|mean| >> std) or overflow: the exact two-pass formula
            std_t, mean_t = torch.std_mean(flat, correction=0)
            std, mean = float(std_t), float(mean_t)
        lo, hi = torch.aminmax(flat)
        row.update(nan=0, inf=0, zero_fraction=zeros / n, mean=mean, std=std, min=float(lo), max=float(hi))
        return row
    nan, inf = int(torch.isnan(flat).sum()), int(torch.isinf(flat).sum())
    x = flat[torch.isfinite(flat)]
    row.update(nan=nan, inf=inf, zero_fraction=(n - int(torch.count_nonzero(x)) - nan - inf) / n)
    if x.numel():
        std, mean = torch.std_mean(x, correction=0)
        lo, hi = torch.aminmax(x)
        row.update(mean=float(mean), std=float(std), min=float(lo), max=float(hi))
    return row


# --------------------------------------------------------------------------- selection


def select_modules(model: nn.Module, modules: Any = None) -> dict[str, nn.Module]:
    """The submodules to capture, by name, in ``named_modules()`` order.

    Args:
        model: the model.
        modules: ``None`` for every submodule; otherwise a name, a glob pattern
            (``"layers.*.act"``), a module class, a class name (``"ReLU"``), or a list of those
            (a string may hold several, separated by commas).

    Raises:
        InspectorError: for a name or pattern that matches nothing, with close names.

    >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    >>> list(select_modules(net, "*"))
    ['0', '1']
    >>> list(select_modules(net, nn.ReLU))
    ['1']
    """
    return _select(model, list(model.named_modules()), modules)


def _select(model: nn.Module, named_modules: list[tuple[str, nn.Module]], modules: Any) -> dict[str, nn.Module]:
    named = [(n, m) for n, m in named_modules if n]
    if modules is None:
        return dict(named)
    items = [modules] if isinstance(modules, (str, type)) else list(modules)
    items = [part for item in items for part in (item.split(",") if isinstance(item, str) else [item])]
    items = [item for item in items if not isinstance(item, str) or item.strip()]
    if not items:
        raise InspectorError("no modules were selected: give names, glob patterns or classes, "
                             "or None for every module")
    names = [n for n, _ in named]
    chosen: set[str] = set()
    for item in items:
        if isinstance(item, type):
            found = {n for n, m in named if isinstance(m, item)}
            if not found:
                raise InspectorError(f"no module of class {item.__name__} in {type(model).__name__}")
        elif isinstance(item, str):
            item = item.strip()
            if any(c in item for c in "*?["):
                found = {n for n in names if fnmatch.fnmatchcase(n, item)}
            elif item in names:
                found = {item}
            else:
                found = {n for n, m in named if type(m).__name__ == item}
            if not found:
                raise InspectorError(_unknown_name_message(item, names, model))
        else:
            raise InspectorError(f"modules must be names, glob patterns or module classes; "
                                 f"got {type(item).__name__}")
        chosen |= found
    return {n: m for n, m in named if n in chosen}


def _unknown_name_message(item: str, names: list[str], model: nn.Module) -> str:
    close = difflib.get_close_matches(item, names, n=5, cutoff=0.5)
    if not close and any(c in item for c in "*?["):
        stem = item.split("*")[0].split("?")[0].split("[")[0]
        close = [n for n in names if n.startswith(stem)][:5] or \
            difflib.get_close_matches(stem, names, n=5, cutoff=0.4)
    hint = (f"close names: {', '.join(close)}" if close else
            f"module names look like: {', '.join(names[:5])}" if names else "it has no submodules")
    kind = "pattern" if any(c in item for c in "*?[") else "module name"
    return f"{type(model).__name__} has no module matching the {kind} {item!r}; {hint}"


# --------------------------------------------------------------------------- recording


def _memcpy(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Copy the bytes of a contiguous CPU tensor with one plain memcpy; False if it can't.

    torch's ``copy_`` splits a large CPU copy over its thread pool, which costs several times
    more CPU time than one memcpy when the cores are busy (as they are during a forward pass).
    """
    if not src.is_contiguous() or src.is_conj() or src.is_neg() or src.numel() == 0:
        return False
    try:
        np.copyto(dst.view(-1).view(torch.uint8).numpy(), src.reshape(-1).view(torch.uint8).numpy())
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


_MEMCPY_BYTES = 1 << 18   # below this torch copies on one thread anyway; clone() is cheaper
_IN_FLIGHT_BYTES = 1 << 30  # GPU clones waiting for their copy to the host, at most


@dataclass(slots=True)
class _Live:
    """A captured output tensor leaf, watched for in-place changes.

    Tensors with a version counter are held until the end of the pass, so a write by any
    code (inside a module or not) is seen; their values are compared with the copy once, at
    the end, and only when the version moved. Inference tensors are held only weakly, so
    capturing keeps no extra memory alive in inference mode; they are compared when a later
    module hands back their storage, and watching one ends when it is gone (its memory may
    then be reused, which a copy does not mind).
    """

    key: str
    path: str
    ref: Callable[[], torch.Tensor | None]
    copy: torch.Tensor
    version: int | None
    source: torch.device
    change: float | None = None
    by: str | None = None
    written_by: list[str | None] = field(default_factory=list)


def _storage_key(t: torch.Tensor) -> int | None:
    """The address where ``t``'s storage starts (no storage object is made: this runs per hook)."""
    if t.layout != torch.strided or t.is_meta or t.numel() == 0:
        return None
    try:
        return t.data_ptr() - t.storage_offset() * t.element_size()
    except (RuntimeError, NotImplementedError):
        return None


def _top_tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors of a value and of its first level (tuple, list or dict items): O(size)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v
    elif isinstance(value, dict):
        for v in value.values():
            if isinstance(v, torch.Tensor):
                yield v


def _flat(value: Any) -> tuple[list[Any], Any, list[str] | None]:
    """(leaves, spec, paths): a fast path for a tensor and for flat tuples and lists of
    tensors; pytree for anything else (spec None means the value is one tensor)."""
    if isinstance(value, torch.Tensor):
        return [value], None, None
    if type(value) in (tuple, list) and all(isinstance(v, torch.Tensor) or v is None for v in value):
        return list(value), type(value), [f"[{i}]" for i in range(len(value))]
    leaves, spec = pytree.tree_flatten(value)
    return leaves, spec, None


def _unflat(out: list[Any], spec: Any) -> Any:
    if spec is None:
        return out[0]
    if spec in (tuple, list):
        return spec(out)
    return pytree.tree_unflatten(out, spec)


class _Recorder:
    """Hooks on every module; copies what is selected, watches what was copied."""

    def __init__(self, model: nn.Module, named: list[tuple[str, nn.Module]], selected: dict[str, nn.Module],
                 store_on: Any, max_bytes: int | None, grads: bool, keep_inputs: bool,
                 keep_references: bool) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise InspectorError(f"max_bytes must be 0 or more (or None for no limit), got {max_bytes}")
        self.model = model
        self.named = named
        self.selected_ids = {id(m) for m in selected.values()}
        self.store_on = resolve_device(store_on)
        if self.store_on.type == "meta":
            raise InspectorError("store_on='meta' would keep no values; choose cpu or a GPU")
        self.to_cpu = self.store_on.type == "cpu"
        self.max_bytes = max_bytes
        self.want_grads = grads
        self.keep_inputs = keep_inputs
        self.keep_references = keep_references
        self.result = Captures(store_on=str(self.store_on))
        self.ident = threading.get_ident()
        self.used = 0
        self.full = False
        self.calls: dict[str, int] = {}
        self.live: list[_Live] = []
        self.by_storage: dict[int, list[_Live]] = {}
        self.versioned = False   # whether any watched tensor has a version counter
        self.pending: dict[str, list[str]] = {}   # keys given by pre-hooks (keep_inputs)
        self.handles: list[Any] = []
        self.grad_handles: list[Any] = []
        self.sources: set[torch.device] = set()
        self.copy_streams: dict[torch.device, Any] = {}
        self.in_flight: deque[tuple[Any, int, Any]] = deque()   # (copy done event, bytes, compute stream)
        self.in_flight_bytes = 0
        self.grad_lock = threading.Lock()
        self.training = [(m, m.training) for _, m in named]

    # hooks ----------------------------------------------------------------------------

    def attach(self) -> None:
        """One forward hook per module (a pre-hook too on the selected ones when inputs are kept)."""
        seen: set[int] = set()
        for name, module in self.named:
            if id(module) in seen:
                continue
            seen.add(id(module))
            name = name or "(model)"
            capture = id(module) in self.selected_ids
            if capture and self.keep_inputs:
                self.handles.append(module.register_forward_pre_hook(self._pre_hook(name), with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._hook(name, capture), with_kwargs=True))

    def where(self, exc: BaseException) -> str | None:
        """The innermost module of the model whose forward the exception went through."""
        names = {id(m): n or "(model)" for n, m in self.named}
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
            stored = self._store(key, "input", value, watch=False)
            if stored is not _SKIP:
                self.result.inputs[key] = stored
        return pre_hook

    def _hook(self, name: str, capture: bool) -> Callable:
        ident = self.ident
        get_ident = threading.get_ident
        # the common case, kept to one copy and one record: a CPU tensor output copied to the CPU
        # with no budget, inputs, references or gradients to look after
        fast = capture and self.to_cpu and self.max_bytes is None and not (
            self.keep_inputs or self.keep_references or self.want_grads)
        calls, outputs, order, live, by_storage = (self.calls, self.result.outputs, self.result.order,
                                                   self.live, self.by_storage)
        tensor, cpu, inference_enabled = torch.Tensor, torch.device("cpu"), torch.is_inference_mode_enabled
        no_inference = torch._C._InferenceMode

        def hook(module: nn.Module, args: Any, *kwargs_output: Any) -> None:
            if get_ident() != ident:  # see pre_hook: may come without kwargs
                return
            kwargs, output = kwargs_output if len(kwargs_output) == 2 else (None, kwargs_output[0])
            if by_storage:
                if self.versioned or type(output) is not tensor or output.layout != torch.strided \
                        or output.is_meta:
                    self._watch(name, args, kwargs, output)
                elif output.numel() and (output.data_ptr() - output.storage_offset() * output.element_size()
                                         in by_storage):  # only outputs are watched here: O(1)
                    self._watch(name, args, kwargs, output)
            if not capture:
                return
            if fast and type(output) is tensor and output.layout == torch.strided and \
                    output.device == cpu and output.nbytes < _MEMCPY_BYTES and not output.is_quantized:
                if name in calls:
                    key = self._key(name)
                else:
                    calls[name] = 1
                    key = name
                if inference_enabled():
                    with no_inference(False):
                        copy = output.detach().clone(memory_format=torch.contiguous_format)
                else:
                    copy = output.detach().clone(memory_format=torch.contiguous_format)
                if output.is_inference():
                    rec = _Live(key, "", weakref.ref(output), copy, None, cpu)
                else:
                    rec = _Live(key, "", (lambda t=output: t), copy, output._version, cpu)
                    self.versioned = True
                outputs[key] = copy
                order.append(key)
                if output.numel():
                    skey = output.data_ptr() - output.storage_offset() * output.element_size()
                    live.append(rec)
                    recs = by_storage.get(skey)
                    if recs is None:
                        by_storage[skey] = [rec]
                    else:
                        recs.append(rec)
                return
            pending = self.pending.get(name) if self.keep_inputs else None
            self._capture(pending.pop() if pending else self._key(name), output)
        return hook

    def _watch(self, name: str, args: Any, kwargs: Any, output: Any) -> None:
        """Note which earlier captures this module wrote in place: O(1) per tensor it touched.

        With version counters a write is noted (and its values compared at the end); without
        them (inference mode) a live output whose storage a module hands back is compared now.
        """
        by_storage = self.by_storage
        # only tensors with version counters tell a write through an input; others are compared
        # when a module hands their storage back
        watched = ((output, True), (args, False), (kwargs, False)) if self.versioned else ((output, True),)
        for value, is_output in watched:
            for t in ((value,) if type(value) is torch.Tensor else _top_tensors(value)):
                skey = _storage_key(t)
                recs = by_storage.get(skey)
                if not recs:
                    continue
                if any(rec.ref() is None for rec in recs):  # memory reused: drop what is gone
                    recs[:] = [rec for rec in recs if rec.ref() is not None]
                for rec in recs:
                    if rec.change is not None:
                        continue
                    live = rec.ref()
                    if live is None:  # gone (its memory may be reused): nothing left to watch
                        continue
                    if rec.version is not None:
                        if live._version != rec.version:
                            rec.version = live._version
                            rec.written_by.append(name)
                    elif is_output:
                        self._compare(rec, live, name)

    def _compare(self, rec: _Live, t: torch.Tensor, by: str | None) -> None:
        """Compare the live tensor with its copy now; note a change and who made it."""
        if rec.source.type == "cuda":
            torch.cuda.synchronize(rec.source)  # the copy may still be in flight
        change = _max_change(t, rec.copy)
        if change is None:
            return
        if change != 0.0:
            rec.change, rec.by = change, by
        elif rec.version is not None:
            rec.written_by.append(by)

    def _capture(self, key: str, output: Any) -> None:
        stored = self._store(key, "output", output, watch=True)
        if stored is not _SKIP:
            self.result.outputs[key] = stored
            self.result.order.append(key)
            if self.keep_references:
                self.result.references[key] = output
            if self.want_grads:
                self._grad_hooks(key, output)

    def _store(self, key: str, kind: str, value: Any, watch: bool) -> Any:
        """A copy of ``value`` leaf by leaf, or _SKIP (and a Skipped record)."""
        if isinstance(value, torch.Tensor) and not value.is_meta:  # the common case, kept short
            nbytes = value.numel() * value.element_size()
            if not self.full and (self.max_bytes is None or self.used + nbytes <= self.max_bytes):
                self.used += nbytes
                copy = self._copy(value)
                if watch:
                    self._track(key, "", value, copy)
                return copy
        leaves, spec, paths = _flat(value)
        nbytes = 0
        tensors = 0
        for t in leaves:
            if isinstance(t, torch.Tensor):
                tensors += 1
                nbytes += t.numel() * t.element_size()
        if not tensors:
            if kind == "output":
                self.result.skipped.append(Skipped(key, kind, "", 0, f"the {kind} is a "
                                                   f"{type(value).__name__}, not a tensor or a "
                                                   "structure holding tensors"))
            return _SKIP
        if self.full or (self.max_bytes is not None and self.used + nbytes > self.max_bytes):
            self.full = True
            self.result.skipped.append(Skipped(key, kind, "", nbytes,
                                               f"over the byte budget ({self.used} of {self.max_bytes} "
                                               "bytes used)"))
            return _SKIP
        self.used += nbytes
        if spec is not None and paths is None and len(leaves) > 0:
            paths = _leaf_paths(value, spec)
        out = []
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor):
                copy = self._copy(leaf)
                if copy is None:
                    self.result.skipped.append(Skipped(key, kind, paths[i] if paths else "", 0,
                                                       "a meta tensor has no values"))
                elif watch:
                    self._track(key, paths[i] if paths else "", leaf, copy)
                out.append(copy)
            elif isinstance(leaf, _KEEP_AS_IS):
                out.append(leaf)
            else:
                self.result.skipped.append(Skipped(key, kind, paths[i] if paths else "", 0, f"a {type(leaf).__name__} is not "
                                                   "a tensor; it was left out (None in its place)"))
                out.append(None)
        return _unflat(out, spec)

    def _copy(self, t: torch.Tensor) -> torch.Tensor | None:
        """One copy of ``t`` where the captures are kept; a plain tensor even in inference mode."""
        if t.is_meta:
            return None
        if torch.is_inference_mode_enabled():
            with torch._C._InferenceMode(False):
                return self._copy_now(t)
        return self._copy_now(t)

    def _copy_now(self, t: torch.Tensor) -> torch.Tensor:
        src = t.detach()
        device = src.device
        if device not in self.sources:
            self.sources.add(device)
        plain = type(src) is torch.Tensor and src.layout == torch.strided and not src.is_quantized
        if self.to_cpu and plain:
            if device.type == "cpu":
                if src.numel() * src.element_size() >= _MEMCPY_BYTES:
                    dst = torch.empty(src.shape, dtype=src.dtype)
                    if _memcpy(dst, src):
                        return dst
                return src.clone(memory_format=torch.contiguous_format)
            if device.type == "cuda":
                return self._to_host(src)
            return src.to("cpu", copy=True)
        if device == self.store_on:
            return src.clone()
        return src.to(self.store_on, copy=True, non_blocking=device.type == "cuda")

    def _to_host(self, src: torch.Tensor) -> torch.Tensor:
        """Copy a CUDA tensor into pinned CPU memory on a side stream, overlapping the forward.

        A private clone is taken on the compute stream first (device-to-device, cheap), so a later
        in-place write to the live tensor can never race with the copy; the copy stream waits for
        that clone, and the allocator does not reuse the clone's memory before the copy is done
        (``record_stream``). At most ``_IN_FLIGHT_BYTES`` of clones wait at a time: beyond that the
        compute stream waits for the oldest copy (a stream wait; the CPU never blocks). The only
        synchronisation is at the end of the capture.
        """
        device = src.device
        side = self.copy_streams.get(device)
        if side is None:
            side = self.copy_streams[device] = torch.cuda.Stream(device)
        compute = torch.cuda.current_stream(device)
        private = src.clone(memory_format=torch.contiguous_format)
        side.wait_stream(compute)
        dst = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        with torch.cuda.stream(side):
            dst.copy_(private, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        private.record_stream(side)
        nbytes = private.numel() * private.element_size()
        self.in_flight.append((done, nbytes, compute))
        self.in_flight_bytes += nbytes
        while self.in_flight_bytes > _IN_FLIGHT_BYTES and len(self.in_flight) > 1:
            event, n, stream = self.in_flight.popleft()
            stream.wait_event(event)
            self.in_flight_bytes -= n
        return dst

    def _track(self, key: str, path: str, t: torch.Tensor, copy: torch.Tensor) -> None:
        skey = _storage_key(t)
        if skey is None:
            return
        if t.is_inference():
            version, ref = None, weakref.ref(t)
        else:
            version, ref = t._version, (lambda t=t: t)
            self.versioned = True
        rec = _Live(key, path, ref, copy, version, t.device)
        self.live.append(rec)
        recs = self.by_storage.get(skey)
        if recs is None:
            self.by_storage[skey] = [rec]
        else:
            recs.append(rec)

    def _grad_hooks(self, key: str, output: Any) -> None:
        if isinstance(output, torch.Tensor):
            items = [("", output)]
        else:
            items = list(_tensor_leaves(output))
        for path, t in items:
            if t.requires_grad:
                self.grad_handles.append(t.register_hook(self._grad_hook(key, path, len(items) == 1 and path == "")))

    def _grad_hook(self, key: str, path: str, single: bool) -> Callable:
        def hook(grad: torch.Tensor) -> None:
            with self.grad_lock:
                nbytes = grad.numel() * grad.element_size()
                if self.full or (self.max_bytes is not None and self.used + nbytes > self.max_bytes):
                    self.full = True
                    self.result.skipped.append(Skipped(key, "grad", path, nbytes, "over the byte budget "
                                                       f"({self.used} of {self.max_bytes} bytes used)"))
                    return
                self.used += nbytes
                copy = self._copy(grad)
                if single:
                    self.result.grads[key] = copy
                else:
                    self.result.grads.setdefault(key, {})[path] = copy
        return hook

    # end ------------------------------------------------------------------------------

    def detach(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        for m, training in self.training:
            if m.training != training:
                m.train(training)

    def finish(self) -> Captures:
        for h in self.grad_handles:
            h.remove()
        self.grad_handles.clear()
        for dev in self.sources | {self.store_on}:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)  # the one synchronisation: every copy is done after it
        self.in_flight.clear()
        self.in_flight_bytes = 0
        self._settle_mutations()
        self.live.clear()
        self.by_storage.clear()
        r = self.result
        if self.max_bytes == 0:
            r.findings.append(Finding("capture-budget-zero", "warning", "",
                                      "max_bytes is 0, so nothing was captured; give a positive byte "
                                      "budget, or None for no limit"))
        elif any(s.reason.startswith("over the byte budget") for s in r.skipped):
            over = [s for s in r.skipped if s.reason.startswith("over the byte budget")]
            r.findings.append(Finding("capture-over-budget", "info", over[0].module,
                                      f"the byte budget of {self.max_bytes} bytes was reached at "
                                      f"{over[0].module}; {len(over)} captures were skipped "
                                      f"({sum(s.bytes for s in over)} bytes)"))
        for s in r.skipped:
            if not s.reason.startswith("over the byte budget"):
                r.findings.append(Finding("capture-not-tensor", "info", s.module,
                                          f"{s.module}{s.path}: {s.reason}"))
        r._state["done"] = True
        return r

    def _settle_mutations(self) -> None:
        r = self.result
        for rec in self.live:
            t = rec.ref()
            if rec.change is None and t is not None and rec.version is not None:
                if t._version != rec.version:  # written after the last module that touched it
                    rec.written_by.append(None)
                if rec.written_by:  # one comparison, after the pass; the first writer is named
                    writers, rec.written_by = rec.written_by, []
                    self._compare(rec, t, writers[0])
                    if rec.change is None:
                        rec.written_by = writers
            if rec.change is None and rec.written_by:
                by = rec.written_by[0]
                r.findings.append(Finding("capture-written-same-values", "info", rec.key,
                                          f"{rec.key}{rec.path} was written in place"
                                          f"{' by ' + by if by else ''} after its capture, "
                                          "but its values did not change"))
            if rec.change is None:
                continue
            change = rec.change
            r.mutations.append(Mutation(rec.key, rec.path, rec.by,
                                        "value" if rec.version is None else "version", change))
            if rec.key not in r.mutated:
                r.mutated[rec.key] = rec.by
                by = f"by {rec.by}" if rec.by else "after the forward pass or outside any module"
                r.findings.append(Finding(
                    "capture-mutated", "warning", rec.key,
                    f"the live output of {rec.key} was overwritten in place {by} after the hook saw it "
                    f"(largest change {change:.4g}); a hook that kept a bare reference would hold the "
                    "overwritten values. The capture is a copy taken before."))


_SKIP = object()


def _leaf_paths(value: Any, spec: Any) -> list[str]:
    if spec is None:
        return [""]
    return [pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path(value)[0]]


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool | None:
    """Whether two contiguous CPU tensors hold the same bytes (one single-threaded pass);
    None when that cannot be checked this way."""
    if a.device.type != "cpu" or not (a.is_contiguous() and b.is_contiguous()) or a.numel() == 0 \
            or a.is_conj() or b.is_conj() or a.is_neg() or b.is_neg():
        return None
    try:
        x = a.reshape(-1).view(torch.uint8).numpy()
        y = b.reshape(-1).view(torch.uint8).numpy()
        if x.size % 8 == 0:
            x, y = x.view(np.int64), y.view(np.int64)
        return bool(np.array_equal(x, y))
    except (RuntimeError, TypeError, ValueError):
        return None


def _max_change(live: torch.Tensor, copy: torch.Tensor) -> float | None:
    """Largest absolute difference between the live tensor and its copy (NaN == NaN)."""
    if live.device == copy.device and live.shape == copy.shape and live.dtype == copy.dtype \
            and live.numel() * live.element_size() < _MEMCPY_BYTES:
        try:  # the common case (a pass-through output, unchanged): one small compare, no temporaries
            if torch.equal(live, copy):
                return 0.0
        except RuntimeError:
            pass
    try:
        with torch.inference_mode(False), torch.no_grad():
            a = live.detach().to(copy.device)
            if a.shape != copy.shape or a.dtype != copy.dtype:
                return float("inf")
            same = _same_bytes(a, copy)
            if same or (same is None and torch.equal(a, copy)):
                return 0.0
            if a.is_floating_point() or a.is_complex():
                diff = (a - copy).abs()  # in the tensors' own precision: no float64 temporaries
                if not bool(torch.isfinite(diff).all()):
                    both_nan = torch.isnan(a) & torch.isnan(copy)
                    diff = torch.nan_to_num(diff.masked_fill_(both_nan, 0), nan=float("inf"))
                return float(diff.max())
            return float((a.double() - copy.double()).abs().max())
    except RuntimeError:
        return None


# --------------------------------------------------------------------------- public API


@contextmanager
def capturing(model: nn.Module, modules: Any = None, store_on: str | torch.device = "cpu",
              max_bytes: int | None = None, grads: bool = False, *, keep_inputs: bool = False,
              keep_references: bool = False, hold_lock: bool = True) -> Iterator[Captures]:
    """Capture activations of the forward (and backward) passes run inside the block.

    Only passes run by the thread that entered the block are recorded. The yielded
    :class:`Captures` is complete when the block ends. Arguments are those of
    :func:`capture_activations`; ``hold_lock=False`` leaves the model's lock alone (the
    caller then makes sure nothing else adds hooks meanwhile).

    >>> net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(inplace=True))
    >>> _ = nn.init.constant_(net[0].weight, -1.0)  # outputs below zero: the ReLU changes them
    >>> with capturing(net) as cap:
    ...     _ = net(torch.ones(1, 2))
    >>> sorted(cap.outputs), list(cap.mutated)
    (['0', '1'], ['0'])
    """
    model = require_module(model, "capturing")
    with _recording(model, modules, store_on, max_bytes, grads, keep_inputs, keep_references,
                    hold_lock) as rec:
        yield rec.result


@contextmanager
def _recording(model: nn.Module, modules: Any, store_on: Any, max_bytes: int | None, grads: bool,
               keep_inputs: bool, keep_references: bool, hold_lock: bool) -> Iterator[_Recorder]:
    named = list(model.named_modules())  # resolved once per call
    selected = _select(model, named, modules)
    lock = model_lock(model) if hold_lock else None
    if lock is not None:
        lock.acquire()
    rec = None
    try:
        rec = _Recorder(model, named, selected, store_on, max_bytes, grads, keep_inputs, keep_references)
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
            rec.finish()
    finally:
        if lock is not None:
            lock.release()


def capture_activations(model: nn.Module, inputs: Any, modules: Any = None,
                        store_on: str | torch.device = "cpu", max_bytes: int | None = None,
                        grads: bool = False, *, keep_inputs: bool = False,
                        keep_references: bool = False,
                        loss_fn: Callable[[Any, Any], torch.Tensor] | None = None) -> Captures:
    """Run ``model`` on ``inputs`` and capture module outputs as detached copies.

    Holds the model's lock; hooks are removed when it returns, also when the forward pass
    raises; the model's own hooks, ``training`` flags, grad mode and buffers are left as they
    were (a training-mode BatchNorm's running statistics are put back after the pass).

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
        keep_references: also keep the bare live outputs (``.references``), to show what a
            naive hook would have seen.
        loss_fn: ``loss_fn(outputs, inputs)`` for ``grads=True``; default: the sum of the
            floating-point outputs.

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
    """
    model = require_module(model, "capture_activations")
    if grads and torch.is_inference_mode_enabled():
        raise InspectorError("grads=True needs autograd, which inference mode turns off; call "
                             "capture_activations outside torch.inference_mode()")
    with _recording(model, modules, store_on, max_bytes, grads, keep_inputs, keep_references,
                    True) as rec, _buffers_kept(model), kept_sharded(model):
        try:
            with torch.enable_grad() if grads else _nullcontext():
                output = call_model(model, inputs)
                if grads:
                    _backward(model, output, inputs, loss_fn, rec.result)
        except InspectorError:
            raise
        except Exception as exc:
            where = rec.where(exc)
            raise InspectorError(f"the forward pass of {type(model).__name__} failed"
                                 f"{' in module ' + where if where else ''}: "
                                 f"{type(exc).__name__}: {exc}") from exc
    cap = rec.result
    object.__setattr__(cap, "model_output", output)
    return cap


@contextmanager
def _nullcontext() -> Iterator[None]:
    yield


@contextmanager
def _buffers_kept(model: nn.Module) -> Iterator[None]:
    """Put buffers back as they were (a training-mode BatchNorm updates its running stats)."""
    if not any(m.training for m in model.modules()):
        yield
        return
    with torch.inference_mode(False), torch.no_grad():
        saved = [(b, b.clone()) for b in model.buffers() if b.device.type != "meta"]
    try:
        yield
    finally:
        with torch.inference_mode(False), torch.no_grad():
            for b, before in saved:
                if not torch.equal(b, before):
                    b.copy_(before)


def _backward(model: nn.Module, output: Any, inputs: Any,
              loss_fn: Callable[[Any, Any], torch.Tensor] | None, cap: Captures) -> None:
    if loss_fn is not None:
        loss = loss_fn(output, inputs)
    else:
        parts = [t.float().sum() for _, t in _tensor_leaves(output) if t.is_floating_point()]
        if not parts:
            raise InspectorError("grads=True needs a floating-point model output or a loss_fn")
        loss = torch.stack(parts).sum()
    wrt = [p for p in model.parameters() if p.requires_grad]
    if not loss.requires_grad or not wrt:
        cap.findings.append(Finding("capture-no-grads", "warning", "",
                                    "no gradients were captured: no parameter requires grad, so "
                                    "the loss does not depend on anything trainable"))
        return
    torch.autograd.grad(loss, wrt, allow_unused=True)
