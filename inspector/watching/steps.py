"""The per-step work of a watch: what is kept between hooks, and one transfer to the host."""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable
from contextlib import nullcontext
from itertools import repeat
from typing import Any, Protocol

import numpy as np
import torch

from ..utils.dtensors import is_dtensor
from ..utils.findings import Finding
from ..utils.norms import NormPlan
from .flags import _PLAIN, _piece
from .layout import (
    Layout,
    current,
    fused_norms,
    global_norms,
    global_squares,
    gradients,
    norm_pairs,
    shard_key,
    to_host,
)
from .numbers import BATCH_PRODUCER, NO_PRODUCER, Numbers, Resident, all_finite, memory, nans
from .tracer import BATCH, CHECKED, NonfiniteTracer, Trace, floating


class Watched(Protocol):
    """What a step's work reads of the watch (:class:`~.core.Watch` is one; it calls in here)."""

    @property
    def root(self) -> torch.nn.Module: ...
    @property
    def layout(self) -> Layout: ...
    @property
    def module_names(self) -> list[str]: ...
    @property
    def scaler(self) -> Any: ...
    @property
    def sharded(self) -> bool: ...
    @property
    def update_ratio(self) -> bool: ...
    @property
    def state(self) -> StepState: ...
    @property
    def tracer(self) -> NonfiniteTracer | None: ...


class StepState:
    """What one step carries from the optimizer's pre-step hook to its post-step hook, and from one step
    to the next: each parameter's version and storage after the step (a parameter that moved since was
    written outside the optimizer, and is read before this step uses it) and the batch's range."""

    def __init__(self) -> None:
        self.count = 0
        self.start = time.perf_counter()
        self.params: list[torch.Tensor | None] = []
        self.grad_parts: list[tuple[np.ndarray, torch.Tensor]] = []
        self.grads_global = False  # grad_parts made global (every rank's pieces) by the clip
        self.check_local: Any = None  # this rank's numbers of the distributed check, sent after the step
        self.grads: list[torch.Tensor | None] = []  # the gradients whose norms those are
        self.closure = False  # the step was given a closure (it may make new gradients after they are read)
        self.has_grad = np.zeros(0, dtype=bool)
        self.before: list[torch.Tensor] | None = None
        self.findings: list[Finding] = []
        self.last_scale = math.nan
        self.marks: tuple[list[int], list[int]] = ([], [])  # each parameter's version and address after
        # the step (-2 for a None or a tensor subclass: not followed); two lists of ints, no object each
        self.moved_parts: list[tuple[np.ndarray, torch.Tensor]] = []  # norms of those written since
        self.written: list[int] = []  # parameters written outside the optimizer holding NaN/Inf (host)
        self.batch: list[torch.Tensor] = []  # (low, high) of each floating input of this step's forwards
        self._keys: tuple[list[torch.Tensor | None], list[Any]] = ([], [])
        # the grouping of the norms of the gradients, parameters, buffers and updates, kept from step to step
        self.plans = {k: NormPlan() for k in ("grads", "params", "buffers", "updates")}
        self.resident = Resident()  # this process's RSS, read every step (closed when the watch closes)

    def pre(self, params: list[torch.Tensor | None], snapshot: bool, findings: list[Finding]) -> None:
        self.params = params
        self.grads = grads = gradients(params)
        self.has_grad = np.fromiter(map(operator.is_not, grads, repeat(None)), dtype=bool, count=len(grads))
        self.grad_parts = fused_norms(grads, self.plans["grads"])
        self.grads_global = False
        self.before = [p.detach().clone() for p in params if p is not None] if snapshot else None
        self.findings = findings
        versions, places = self.marks
        now = _marks(params) if versions else ([], [])
        moved = [] if now == self.marks else [
            i for i, (v, a, nv, na) in enumerate(zip(versions, places, *now, strict=False))
            if v != -2 and nv != -2 and (v, a) != (nv, na)]
        parts = fused_norms([params[i] for i in moved]) if moved else []
        self.moved_parts = [(np.asarray(moved, dtype=np.int64)[idx], t) for idx, t in parts]

    def global_grad_total(self) -> torch.Tensor | None:
        """The 2-norm of all the gradients of a sharded model (every rank's pieces), from the norms just
        measured; they are made global in place (:attr:`grads_global`), so the step does not reduce them
        again. None when no parameter is sharded."""
        keys = self.shard_keys(self.params)
        first = next((p for p, k in zip(self.params, keys, strict=True) if k is not None), None)
        if first is None:
            return None
        device = first.to_local().device  # type: ignore[attr-defined]
        dense = global_squares([self.grad_parts], keys, device)
        assert dense is not None  # a key is set
        n = len(keys)
        self.grad_parts = norm_pairs([self.grad_parts], dense, keys, device)[0]
        self.grads_global = True
        return torch.where(dense[0][n:] > 0, dense[0][:n], 0.0).sum().sqrt().float()

    def shard_keys(self, params: list[torch.Tensor | None]) -> list[Any]:
        """:func:`~.layout.shard_key` of each parameter, worked out again only when a parameter is
        another object than at the last call (a DTensor parameter keeps its placements)."""
        held, keys = self._keys
        if len(held) != len(params) or not all(map(operator.is_, params, held)):
            self._keys = (list(params), [shard_key(p) for p in params])
        return self._keys[1]

    def see_batch(self, args: Any, kwargs: Any) -> None:
        """When a training forward ends: the range of each floating tensor the model was given, as its
        forward took it (NaN or Inf there is the batch's, not the model's)."""
        first = args[0] if len(args) == 1 and not kwargs else None
        if type(first) is torch.Tensor:  # one plain tensor (most models): no walk over the arguments
            tensors = [first] if first.dtype in CHECKED and first.numel() else []
        else:
            tensors = floating((args, kwargs))
        for t in tensors:
            low, high = torch.aminmax(_piece(t))
            self.batch += [low, high]

    def post(self) -> None:
        self.count += 1
        self.start = time.perf_counter()
        self.marks = _marks(self.params)
        self.params, self.grad_parts, self.before, self.moved_parts, self.batch = [], [], None, [], []
        self.grads, self.closure = [], False


def _marks(params: list[torch.Tensor | None]) -> tuple[list[int], list[int]]:
    """:func:`_mark` of each parameter as two lists (-2 for a None or a tensor subclass); for a list of
    plain tensors, by two passes in C (1,000 parameters: about 0.15 ms against 0.6 ms)."""
    if set(map(type, params)) <= _PLAIN_TYPES:
        try:
            return list(map(_VERSION, params)), list(map(_PTR, params))
        except RuntimeError:  # an inference tensor among them
            pass
    marks = [(-2, -2) if p is None or type(p) not in _PLAIN else _mark(p) for p in params]
    return [v for v, _ in marks], [a for _, a in marks]


_PLAIN_TYPES = set(_PLAIN)
# the unbound method (the types are checked to be plain first): half the time of a methodcaller
_VERSION = operator.attrgetter("_version")
_PTR: Callable[[Any], int] = torch.Tensor.data_ptr


def _mark(p: torch.Tensor) -> tuple[int, int]:
    """What a write into ``p`` moves: its version counter (every in-place write) and its storage (a
    ``.data =`` swap)."""
    try:
        return p._version, p.data_ptr()
    except RuntimeError:  # an inference tensor has no version counter
        return -1, -1


def _grad(p: torch.Tensor | None) -> torch.Tensor | None:
    return None if p is None else p.grad


def transfer_step(w: Watched, check: bool, logged: dict[str, Any]) -> tuple[Numbers, dict[str, float]]:
    """Everything measured this step, with the scalars ``logged`` since the last one, brought to the host
    with one copy per device."""
    st, layout = w.state, w.layout
    params = st.params
    grad_parts, param_parts, buffer_parts, update_parts = _norm_parts(w, check)
    parts: list[torch.Tensor] = [t for _, t in grad_parts + param_parts + buffer_parts + update_parts
                                 + st.moved_parts]
    taken = len(parts)  # the norms; then the batch's range, the trace, the logged tensors and the scale
    if st.batch:
        b = st.batch
        device = b[0].device
        parts.append(torch.stack(b if all(t.dtype is _F32 and t.device == device for t in b) else
                                 [t.float().to(device) for t in b]))
    calls, meta, values = w.tracer.take() if w.tracer is not None else ([], [], [])
    if values:
        parts.append(torch.cat([v.reshape(-1) for v in values]))
    tensors = {k: v for k, v in logged.items() if isinstance(v, torch.Tensor)}
    parts += [v.float().reshape(1) for v in tensors.values()]
    scale = getattr(w.scaler, "_scale", None) if w.scaler is not None else None
    if isinstance(scale, torch.Tensor):
        parts.append(scale.reshape(1))
    host = to_host(parts)
    pos = 0
    width = len(layout.parameters)

    def spread(pairs: list[tuple[np.ndarray, torch.Tensor]], width: int = width) -> np.ndarray:
        nonlocal pos
        if len(pairs) == 1 and _in_order(pairs[0][0], width):  # one group of every tensor, in order
            pos += 1
            return host[pos - 1].astype(np.float64)
        out = nans(width)
        for idx, _ in pairs:
            out[idx] = host[pos]
            pos += 1
        return out

    # every norm measured is a finite number (most steps): no overflow to tell from an Inf, no NaN/Inf
    # element to count, no parameter written outside the optimizer holding NaN/Inf
    finite = all(map(all_finite, host[:taken]))
    param_grad, param_norm = spread(grad_parts), spread(param_parts)
    buffer_norm = spread(buffer_parts, len(layout.buffers))
    update = spread(update_parts) if w.update_ratio else _NONE
    moved = spread(st.moved_parts) if st.moved_parts else _NONE
    if st.moved_parts and not finite:
        _overflowed(moved, lambda: params)  # a huge finite weight is not NaN/Inf
        st.written = sorted(int(i) for idx, _ in st.moved_parts for i in idx if not np.isfinite(moved[i]))
    else:
        st.written = []
    modules = len(layout.modules)
    n = Numbers(modules, width, len(layout.buffers), checked=float(check), param_grad=param_grad,
                param_norm=param_norm, buffer_norm=buffer_norm, module_grad=_PLACEHOLDER,
                module_param=nans(modules), module_update=nans(modules), module_nonfinite=_PLACEHOLDER)
    n.has_grad = st.has_grad
    batch = host[pos] if st.batch else None
    pos += 1 if st.batch else 0
    flags = host[pos] > 0 if values else np.zeros(0, dtype=bool)
    pos += 1 if values else 0
    scalars = {k: float(host[pos + i][0]) for i, k in enumerate(tensors)}
    pos += len(tensors)
    scalars.update({k: float(v) for k, v in logged.items() if not isinstance(v, torch.Tensor)})
    if isinstance(scale, torch.Tensor):
        n.scale = float(host[pos][0])
    elif w.scaler is not None and hasattr(w.scaler, "get_scale"):
        n.scale = float(w.scaler.get_scale())
    n.skipped = float(n.scale < st.last_scale)
    st.last_scale = n.scale
    # every parameter's gradient measured, each a finite number (most steps): none to count NaN/Inf in
    n.whole = whole = finite and not w.sharded and sum(len(idx) for idx, _ in grad_parts) == width
    _fill(n, w, params, update, check, finite, whole)
    n.loss_logged = float("loss" in scalars)
    n.loss = scalars.pop("loss", math.nan)
    # a NaN/Inf that reached neither the loss nor a gradient (an additive mask of -inf, a masked padding
    # position) made nothing non-finite: no producer is named for it
    if n.nonfinite > 0 or (n.loss_logged and not math.isfinite(n.loss)):
        _producers(n, w.module_names, calls, meta, flags)
        if batch is not None and not np.isfinite(batch).all() and n.forward == NO_PRODUCER:
            n.forward = BATCH_PRODUCER
    return n, scalars


Pairs = list[tuple[np.ndarray, torch.Tensor]]


def _in_order(idx: np.ndarray, width: int) -> bool:
    """Whether ``idx`` is ``0, 1, ..., width - 1``: worked out once per array (a norm plan keeps its
    positions from step to step), the array kept with the answer so its id is not reused."""
    if len(idx) != width:
        return False
    seen = _ORDERED.get(id(idx))
    if seen is None or seen[0] is not idx:
        if len(_ORDERED) > 64:
            _ORDERED.clear()
        seen = _ORDERED[id(idx)] = (idx, bool(np.array_equal(idx, np.arange(width))))
    return seen[1]


_ORDERED: dict[int, tuple[np.ndarray, bool]] = {}
_NONE = np.zeros(0)  # a set of norms not taken this step (read by nothing)
_QUIET = nullcontext()
_NO_INDEX = np.zeros(0, dtype=np.int64)
_PLACEHOLDER = np.zeros(1)  # a module array _fill always replaces
_F32 = torch.float32


def _norm_parts(w: Watched, check: bool) -> tuple[Pairs, Pairs, Pairs, Pairs]:
    """Gradient, parameter, buffer and update norms on the device (global ones under FSDP2 / TP)."""
    st = w.state
    params = st.params
    param_parts = fused_norms(params, st.plans["params"]) if check else []
    buffers = current(w.root, w.layout.buffers, "buffer") if check and w.layout.buffers else []
    buffer_parts = fused_norms(buffers, st.plans["buffers"]) if buffers else []
    update_parts: Pairs = []
    if st.before is not None:
        live = [p.detach() for p in params if p is not None]
        update_parts = fused_norms(list(torch._foreach_sub(live, st.before)), st.plans["updates"])
        positions = np.flatnonzero([p is not None for p in params])
        update_parts = [(positions[idx], t) for idx, t in update_parts]
    grad_parts = st.grad_parts
    if w.sharded:
        keys = st.shard_keys(params)
        first = next(p for p, k in zip(params, keys, strict=True) if k is not None) if any(keys) else None
        if first is not None:
            device = first.to_local().device  # type: ignore[attr-defined]
            sets = (
                ([] if st.grads_global else [grad_parts])  # made global by the clip already
                + ([param_parts] if check else [])
                + ([update_parts] if st.before is not None else [])
            )
            done = global_norms(sets, keys, device) if sets else []
            if not st.grads_global:
                grad_parts = done.pop(0)
            param_parts = done.pop(0) if check else param_parts
            update_parts = done.pop(0) if st.before is not None else update_parts
    return grad_parts, param_parts, buffer_parts, update_parts


def _overflowed(norms: np.ndarray, tensors: Callable[[], list[torch.Tensor | None]]) -> None:
    """Where a float32 norm came out Inf, tell an overflow of the sum of squares (values near
    1e20 and up, all finite) from a real Inf value: recompute those norms in float64 (rare: a
    sync per such tensor; a sharded tensor's local piece). ``tensors`` is called only then."""
    bad = np.flatnonzero(np.isinf(norms))
    if not len(bad):
        return
    held = tensors()
    for i in bad:
        t = held[i]
        if t is None:
            continue
        piece = (t.to_local() if is_dtensor(t) else t).detach()
        if bool(torch.isfinite(piece).all()):
            norms[i] = float(torch.linalg.vector_norm(piece.double()))


def _fill(n: Numbers, w: Watched, params: list[torch.Tensor | None], update: np.ndarray, check: bool,
          finite: bool = False, whole: bool = False) -> None:
    """The step's sums and per-module figures; ``finite``: every norm measured is a finite number, so
    none overflowed (the float64 look at each Inf norm is skipped: there is none); ``whole``: also every
    parameter has a gradient, its norm measured (no gradient to leave out, no NaN/Inf to count)."""
    layout = w.layout
    if not finite:
        _overflowed(n.param_grad, lambda: gradients(params))
        if check:
            _overflowed(n.param_norm, lambda: params)
            _overflowed(n.buffer_norm, lambda: current(w.root, layout.buffers, "buffer"))
    if whole:  # what the two lines below come to then
        g, bad = n.param_grad, _NO_INDEX
    else:
        g = np.where(n.has_grad, n.param_grad, 0.0)  # float64, as the norms are spread
        bad = (n.has_grad & ~np.isfinite(n.param_grad)).nonzero()[0]  # NaN/Inf, or a gradient unmeasured
    if len(bad):
        counts = np.zeros(len(params))
        for i in bad:  # rare: a sync per bad tensor
            grad = _grad(params[i])
            if grad is not None:
                counts[i] = float(torch.isnan(grad).sum() + torch.isinf(grad).sum())
        n.nonfinite = float(counts.sum())
        n.module_nonfinite = layout.per_module(counts, "sum")
    else:  # what the sums of no counts come to
        n.nonfinite, n.module_nonfinite = 0.0, np.zeros(len(layout.modules))
    # every norm a finite float32 (most steps): no square, sum or root below can overflow or be invalid, and
    # only the update ratios divide, so numpy's error state need not be set (a context of its own each step)
    with np.errstate(all="ignore") if not finite or w.update_ratio else _QUIET:
        squares = g * g  # the squares once, for the modules' norms and the total
        n.module_grad = layout.norms_of_squares(squares)
        n.grad_norm = float(np.sqrt(np.add.reduce(squares)))  # np.sum's reduction, less its wrapper
        if check:
            norms = n.param_norm
            n.module_param = layout.norms_of_squares(norms * norms)
            if w.update_ratio:
                n.module_update = layout.per_module(np.nan_to_num(update, nan=0.0)) / n.module_param
    first = params[0] if params and params[0] is not None else next(
        (p for p in params if p is not None), None)
    device = first.device if first is not None else None
    n.device_allocated, n.device_peak, n.rss = memory(device, w.state.resident)
    n.step_time = time.perf_counter() - w.state.start


def _producers(n: Numbers, module_names: list[str], calls: list[str], meta: object,
               flags: np.ndarray) -> None:
    """``n.forward`` / ``n.backward``: the producers the step's trace names (``tracer.Trace``);
    when several modules took the tensor whose gradient turned NaN/Inf, all of them are kept
    as ``n.backward_candidates`` (names; this rank's numbers only, not gathered)."""
    if not len(flags) or not isinstance(meta, Trace) or not flags.any():  # nothing non-finite: no producer
        return
    index = {name: i for i, name in enumerate(module_names)}
    forward = meta.forward(flags, module_names[0])
    if forward is not None:
        at = float(index.get(forward.module, NO_PRODUCER))
        n.forward = BATCH_PRODUCER if forward.module == BATCH else at
    blame = meta.backward(flags)
    if blame is not None:
        n.backward = float(index.get(blame.module, NO_PRODUCER))
        vars(n)["backward_candidates"] = blame.candidates
