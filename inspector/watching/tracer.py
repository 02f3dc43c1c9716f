"""Non-finite forward and backward tracing without a host sync per module.

Every floating tensor a module call takes or returns gets a *slot* the first time the step
sees it (the same tensor object, unchanged since, keeps its slot: a module's output is the
next one's input, and a container's are its children's), and one ``torch.aminmax`` on the
device; a tensor that requires grad gets one gradient hook, whose ``aminmax`` of the
gradient is one more flag for that slot. On the host each call is its module, the slots of
its inputs and outputs, and whether it ran during a backward (a forward recomputed by
gradient checkpointing). The flags reach the host once per step, with the step's other
numbers, where :meth:`Trace.forward` and :meth:`Trace.backward` name the producers:

- forward: the first call (forward hooks fire when a call ends, so an inner module before
  the parents that contain it) whose outputs hold NaN/Inf while its inputs were finite;
  recomputed calls are not counted (they repeat a call already seen);
- backward: a call whose forward was finite (inputs and outputs: no blame once the forward
  held NaN/Inf), whose output gradients were seen at least once and were all finite, and
  one of whose input gradients was not. A gradient hook on a tensor sees the sum of every
  consumer's gradient, so when several modules took that same tensor, each of them passes
  the test: they are all named (:attr:`Blame.candidates`), as is, implicitly, any code of
  the parent outside its submodules that used the tensor.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..utils.labels import BATCH_LABEL
from .flags import Stats, _piece

CHECKED = frozenset((torch.float16, torch.bfloat16, torch.float32, torch.float64))  # aminmax takes these
BATCH = BATCH_LABEL  # the name a non-finite batch gets
_SLOT = (1 << 32) - 1
_NONE: tuple[Any, int] = (None, 0)  # no last output
_graph_task = torch._C._current_graph_task_id  # -1 outside a backward
_grad_enabled = torch.is_grad_enabled
_current_node = torch._C._current_autograd_node  # inside a node's pre-hook: that node
_set_grad_enabled = torch._C._set_grad_enabled
_compiling = torch.compiler.is_compiling


def floating(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """The floating-point tensors of a value and of its nested tuples, lists and dicts."""
    out: list[torch.Tensor] = []
    _gather(value, out, depth)
    return out


def _gather(value: Any, out: list[torch.Tensor], depth: int) -> None:
    if isinstance(value, torch.Tensor):
        if value.dtype in CHECKED and value.numel():
            out.append(value)
    elif depth < 3 and isinstance(value, (tuple, list)):
        for v in value:
            _gather(v, out, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for v in value.values():
            _gather(v, out, depth + 1)


@dataclass(frozen=True)
class Producer:
    """The first module call whose outputs turned non-finite while its inputs were finite."""

    module: str
    call: int
    direction: str  # "forward" or "backward"


@dataclass(frozen=True)
class Blame:
    """The backward producer: ``module``, or, when several modules took the tensor whose
    gradient turned NaN/Inf, every one of them (``candidates``, ``module`` the first)."""

    module: str
    candidates: tuple[str, ...]


@dataclass
class Trace:
    """One step's calls on the host. Each flag is an *event* (a tensor's forward values or one
    gradient it received); ``keys`` says which buffer of :class:`Stats` each event went to."""

    calls: list[str] = field(default_factory=list)  # the module's name, per call
    ins: list[int | tuple[int, ...]] = field(default_factory=list)  # input slots, per call (one: an int)
    outs: list[int | tuple[int, ...]] = field(default_factory=list)  # output slots, per call (one: an int)
    again: list[bool] = field(default_factory=list)  # ran during a backward (recomputed)
    keys: list[int] = field(default_factory=list)  # the Stats buffer of each event
    slot_event: list[int] = field(default_factory=list)  # the event of each slot's forward values
    grad_events: list[int] = field(default_factory=list)  # the event of each gradient seen,
    grad_slots: list[int] = field(default_factory=list)  # and its slot (two lists: no tuple per gradient)

    def events(self, flags: Any) -> np.ndarray:
        """The flags of :meth:`Stats.flags` (buffer after buffer) in the order of the events."""
        flags = np.asarray(flags, dtype=bool).reshape(-1)
        keys = np.asarray(self.keys)
        if not len(keys) or not keys.any():
            return flags
        out = np.empty_like(flags)
        out[np.argsort(keys, kind="stable")] = flags
        return out

    def forward(self, flags: Any, root: str) -> Producer | None:
        """The forward producer, or the batch (``BATCH``) when the root's own inputs were non-finite."""
        bad = self.events(flags)[self.slot_event]
        first = None
        for call, name in enumerate(self.calls):
            if self.again[call]:
                continue
            ins, outs = _slots(self.ins[call]), _slots(self.outs[call])
            if name == root and any(bad[s] for s in ins):
                return Producer(BATCH, call, "forward")
            if first is None and any(bad[s] for s in outs) and not any(bad[s] for s in ins):
                first = Producer(name, call, "forward")
        return first

    def backward(self, flags: Any) -> Blame | None:
        """The backward producer by the rule of the module docstring, or None."""
        events = self.events(flags)
        first_bad: dict[int, int] = {}  # slot -> its first non-finite gradient event
        for event, slot in zip(self.grad_events, self.grad_slots, strict=True):
            if events[event]:
                first_bad.setdefault(slot, event)
        if not first_bad:
            return None
        bad = events[self.slot_event]
        seen = set(self.grad_slots)
        found: list[tuple[int, int]] = []  # (event, call)
        for call, held in enumerate(self.ins):
            ins = _slots(held)
            at = [first_bad[s] for s in ins if s in first_bad]
            if not at:
                continue
            outs = _slots(self.outs[call])
            if (any(bad[s] for s in ins) or any(bad[s] for s in outs)
                    or not any(s in seen for s in outs) or any(s in first_bad for s in outs)):
                continue
            found.append((min(at), call))
        if not found:
            return None
        event = min(e for e, _ in found)
        names = list(dict.fromkeys(self.calls[c] for e, c in found if e == event))
        inner = [n for n in names if not any(_inside(o, n) for o in names)]
        return Blame(inner[0], tuple(inner))


def _slots(held: int | tuple[int, ...]) -> tuple[int, ...]:
    return (held,) if type(held) is int else held  # type: ignore[return-value]


def _inside(name: str, parent: str) -> bool:
    """Whether module ``name`` lies inside module ``parent`` (``""`` is the root)."""
    return name != parent and (parent == "" or name.startswith(parent + "."))


class NonfiniteTracer:
    """Forward hooks on every module of ``model`` and gradient hooks on the tensors they see;
    see the module docstring.

    ``keep`` holds each call's inputs and outputs by reference in ``kept`` until the watch reads
    the forward producer at the end of the forward pass (for its captures) or :meth:`take`; the
    flag buffers are sized here, when the watch opens; :meth:`remove` takes every hook off.
    """

    def __init__(self, model: nn.Module, *, backward: bool, keep: bool) -> None:
        self.names = {id(m): n for n, m in model.named_modules()}
        self.backward = backward
        self.keep = keep
        self.trace = Trace()
        self.stats = Stats()
        self.seen: dict[int, Any] = {}  # id -> a weak reference to the tensor seen,
        self.known: dict[int, int] = {}  # and its (version << 33 | slot << 1 | hooked)
        self.kept: dict[int, tuple[Any, Any, int]] = {}  # call -> (args, output, first slot)
        self.handles: list[RemovableHandle] = []
        self.leaf_handles: list[RemovableHandle] = []  # gradient hooks on leaves: they outlive the graph
        self._untraced: Any = None
        self._last: tuple[Any, int] = _NONE  # the last call's single output (its weak reference and its
        # int of ``known``), so a chain's next call takes its slot without a lookup
        self._output_hook, self._leaf_hook = self._output_grad, self._grad  # bound once, not once per tensor
        self.nodes: dict[int, int] = {}  # id of a node whose first output's gradient is hooked -> its slot
        # One hook dict for every node, held by a tensor of its own: ``node._register_hook_dict(holder)``
        # adds a pre-hook that calls what the dict holds with the node's first input gradient, without the
        # dict and handle ``register_prehook`` makes per node (about 2.5 us and two objects for the
        # collector, on the CPU); :meth:`remove` empties it, so a graph kept past the watch calls nothing.
        self._hooks: dict[int, Any] = {0: self._node_grad}
        with torch.inference_mode(False):
            self._holder: torch.Tensor | None = torch.empty(0)
        self._holder._backward_hooks = self._hooks
        try:
            for m in model.modules():
                if m is not model and type(m).forward is nn.Sequential.forward:
                    continue  # a plain Sequential: its input and output are its children's
                self.handles.append(m.register_forward_hook(self._hook, with_kwargs=True))
        except BaseException:
            self.remove()
            raise
        first = next((p for p in model.parameters() if p.dtype in CHECKED), None)
        if first is not None:  # activations and their gradients mostly share the weights' dtype
            self.stats.reserve(_piece(first).device, first.dtype, 64 + 4 * len(self.handles))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self._remove_leaf_hooks()
        self._hooks.clear()
        self.kept.clear()
        self.seen.clear()
        self.known.clear()
        self.nodes.clear()
        self._last = _NONE

    def _remove_leaf_hooks(self) -> None:
        for h in self.leaf_handles:
            h.remove()
        self.leaf_handles.clear()

    def _slot(self, t: torch.Tensor, grad: bool) -> int:
        """The slot of ``t``: its own when the step has seen this tensor, unchanged, before (one int of
        version, slot and hooked, beside a weak reference); else a new one, with ``t``'s (low, high)
        written and, when ``grad``, a hook on its gradient."""
        key = id(t)
        try:
            version = t._version
        except RuntimeError:  # an inference tensor: no version counter, so never shared
            version = -1
        ref = self.seen.get(key)
        trace = self.trace
        tracked = t.requires_grad
        hooked = grad and tracked
        info = self.known.get(key, -1) if ref is not None and version >= 0 and ref() is t else -1
        if info >= 0 and info >> 33 == version:
            slot = (info >> 1) & _SLOT
            if info & 1 or not hooked:
                return slot
        else:
            ref = None
            slot = len(trace.slot_event)
            trace.slot_event.append(len(trace.keys))
            trace.keys.append(self.stats.write(t))  # (grad mode is off in the record: no detach)
        if hooked:
            node = t.grad_fn
            if node is None:  # a leaf (a parameter passed in): its hook outlives the graph
                self.leaf_handles.append(t.register_hook(partial(self._leaf_hook, trace, slot)))
            elif self._holder is None or t.output_nr or id(node) in self.nodes:  # another output of
                # the node, or a second tensor of one: a pre-hook of its own (it goes with the graph)
                node.register_prehook(partial(self._output_hook, trace, slot, t.output_nr))
            else:  # the node keeps its Python object, so its id holds until the node is gone
                self.nodes[id(node)] = slot
                try:
                    node._register_hook_dict(self._holder)
                except (AttributeError, TypeError):  # a torch without it: a pre-hook per node from now on
                    del self.nodes[id(node)]
                    self._holder = None
                    node.register_prehook(partial(self._output_hook, trace, slot, 0))
        if version >= 0:
            try:
                self.seen[key] = ref if ref is not None else weakref.ref(t)
            except TypeError:  # a tensor type without weak references: not shared
                return slot
            self.known[key] = (version << 33) | (slot << 1) | int(hooked)
        return slot

    def _hook(self, module: nn.Module, args: Any, kwargs: Any, output: Any, eager: bool = False) -> None:
        if not eager and _compiling():  # under torch.compile: the record run as it is, not traced (a graph
            if self._untraced is None:  # break per module: the flags are per module; no guards on it)
                self._untraced = torch.compiler.disable(self._hook)
            self._untraced(module, args, kwargs, output, True)
            return
        trace = self.trace
        call = len(trace.calls)
        name = self.names.get(id(module))
        trace.calls.append(type(module).__name__ if name is None else name)
        again = _graph_task() != -1
        trace.again.append(again)
        first = len(trace.slot_event)
        enabled = _grad_enabled()
        grad = self.backward and enabled
        ref, info = self._last
        one = args[0] if len(args) == 1 else None
        if (ref is not None and ref() is one is not None and not kwargs and one._version == info >> 33
                and (info & 1 or not grad)):
            trace.ins.append((info >> 1) & _SLOT)  # the last call's output, unchanged (a chain of modules)
            ins: list[torch.Tensor] = []
        elif type(one) is torch.Tensor and one.dtype in CHECKED and one.numel():
            ins = [one]  # the common case, without the walk
        else:
            ins = floating(args)
        if kwargs:
            ins += floating(kwargs)
        if enabled:  # aminmax(out=) takes a tensor that requires grad only with grad mode off
            _set_grad_enabled(False)
        try:
            if ins:
                trace.ins.append(self._slot(ins[0], grad) if len(ins) == 1
                                 else tuple([self._slot(t, grad) for t in ins]))
            elif len(trace.ins) == call:
                trace.ins.append(())
            if type(output) is torch.Tensor and output.dtype in CHECKED and output.numel():
                slot = self._slot(output, grad)
                trace.outs.append(slot)
                ref = self.seen.get(id(output))  # (an inference tensor is not kept: no ref matches it)
                self._last = _NONE if ref is None else (ref, self.known[id(output)])
            else:
                outs = floating(output)
                trace.outs.append(self._slot(outs[0], grad) if len(outs) == 1
                                  else tuple([self._slot(t, grad) for t in outs]))
        finally:
            if enabled:
                _set_grad_enabled(True)
        if self.keep and not again:
            self.kept[call] = (args, output, first)

    def _grad(self, trace: Trace, slot: int, grad: torch.Tensor | None) -> None:
        """The hook on a leaf's gradient (and, through :meth:`_output_grad`, on a node's other outputs)."""
        if trace is self.trace and grad is not None and grad.dtype in CHECKED and grad.numel():
            trace.grad_events.append(len(trace.keys))
            trace.grad_slots.append(slot)
            trace.keys.append(self.stats.write(grad.detach() if grad.requires_grad else grad))

    def _node_grad(self, grad: torch.Tensor | None) -> None:
        """The pre-hook every node gets through the shared dict: the gradient of its first output."""
        slot = self.nodes.get(id(_current_node()))
        if slot is not None and grad is not None and grad.dtype in CHECKED and grad.numel():
            trace = self.trace  # :meth:`_grad`'s body, inline: this runs for every node (calling it
            trace.grad_events.append(len(trace.keys))  # measured 1.52x a step on 1,000 modules, not 1.48x)
            trace.grad_slots.append(slot)
            trace.keys.append(self.stats.write(grad.detach() if grad.requires_grad else grad))

    def _output_grad(self, trace: Trace, slot: int, index: int,
                     grads: tuple[torch.Tensor | None, ...]) -> None:
        self._grad(trace, slot, grads[index] if index < len(grads) else None)

    @property
    def calls(self) -> list[str]:
        return self.trace.calls

    @property
    def meta(self) -> Trace:
        return self.trace

    @property
    def values(self) -> list[torch.Tensor]:
        """The flags of the events so far (:meth:`Stats.flags`), as a list of one tensor or none."""
        flags = self.stats.flags()
        return [] if flags is None else [flags]

    def take(self) -> tuple[list[str], Trace, list[torch.Tensor]]:
        """The calls, the trace and the device flags gathered so far, and a fresh start (the
        gradient hooks put on leaf tensors this step are taken off)."""
        self._remove_leaf_hooks()
        out = (self.trace.calls, self.trace, self.values)
        self.trace = Trace()
        self.stats.reset()
        self.seen.clear()
        self.known.clear()
        self.nodes.clear()
        self.kept.clear()
        self._last = _NONE
        return out


def forward_producer(calls: list[str], meta: Trace, flags: Any, root: str) -> Producer | None:
    """The forward producer, or the batch (``BATCH``) when the root's own inputs were non-finite."""
    return meta.forward(flags, root) if len(flags) else None
