"""The ops that turned finite inputs into NaN/Inf, forward and backward, while a step is replayed.

:func:`finding_ops` is active during a replay only (a ``TorchDispatchMode``, forward and backward hooks
on the model's own modules, autograd's anomaly mode for the forward stack of each backward node; all
gone when it ends). Every op with a floating output is checked for NaN/Inf; an op whose output has
some while none of its tensor inputs has is recorded as an :class:`OpRecord`: the aten op, the module
it ran in (for a backward op, the module whose forward made its node), the range of each input, and
the user's source line (for a forward op, the innermost frame outside torch and the inspector; for a
backward op, the frame of a custom ``autograd.Function``'s backward if there is one, else the line of
the forward that made the node). Views, copies, uninitialised memory, and ops that write an infinite
constant they were given (``masked_fill(mask, -inf)``, ``torch.tensor(-inf)``: an attention mask) are not
culprits; ``x * inf`` is.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from ..utils.labels import LOSS_LABEL, ROOT_LABEL

MAX_OPS = 16  # culprits recorded per phase
_KEY = "inspector.module"
_TORCH = os.path.dirname(torch.__file__) + os.sep
_INSPECTOR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_LABS = _INSPECTOR + "labs" + os.sep  # the labs' models are model code, not the inspector's machinery


def _ours(name: str) -> bool:
    """Whether a frame's file is torch's or the inspector's own (not the model's or the user's)."""
    return name.startswith(_TORCH) or (name.startswith(_INSPECTOR) and not name.startswith(_LABS)) \
        or name.startswith("<")
_FILLS = ("aten.masked_fill", "aten.fill", "aten.full", "aten.new_full", "aten.index_fill", "aten.where",
          "aten.scatter")  # ops that write a value they are given: an infinite one is a mask
_SKIP = {
    "aten.clone.default",
    "aten.detach.default",
    "aten.copy_.default",
    "aten.lift_fresh.default",
    "aten.alias.default",
    "aten._to_copy.default",
}


@dataclass(frozen=True)
class InputRange:
    """One tensor input of a culprit op: its place in the call, shape, dtype, finite range."""

    arg: str
    shape: tuple[int, ...]
    dtype: str
    low: float
    high: float

    def text(self) -> str:
        return f"{self.arg} {self.dtype}{list(self.shape)} in [{self.low:.4g}, {self.high:.4g}]"


@dataclass(frozen=True)
class OpRecord:
    """An op that made NaN/Inf from finite inputs.

    ``phase`` is ``"forward"`` or ``"backward"``; ``index`` its place among the ops of that phase that
    were checked; ``op`` the aten overload (``aten.log.default``); ``module`` the module path
    (``(loss)`` outside the model); ``source`` ``file:line`` and ``code`` that line's text; ``stack``
    the user's frames, innermost first; ``nan`` and ``inf`` the counts in its output; ``scalars`` the
    non-tensor arguments, as text."""

    phase: str
    index: int
    op: str
    module: str
    source: str
    code: str
    stack: tuple[str, ...]
    inputs: tuple[InputRange, ...]
    output_shape: tuple[int, ...]
    output_dtype: str
    nan: int
    inf: int
    scalars: tuple[str, ...] = ()

    def line(self) -> str:
        made = " and ".join(
            x for x in (f"{self.nan} NaN" if self.nan else "", f"{self.inf} Inf" if self.inf else "") if x
        )
        ins = "; ".join(i.text() for i in self.inputs) or "no tensor input"
        return (
            f"{self.phase} {self.op} in {self.module} at {self.source or '(no source line)'}: made {made} "
            f"from finite inputs ({ins})"
        )


def _user_frames(frame: Any, stop_at_backward: bool) -> list[str]:
    """``file:line`` of the frames outside torch and the inspector, innermost first. With
    ``stop_at_backward`` only the frames inside the autograd engine's call (a custom backward)."""
    out = []
    while frame is not None:
        name = frame.f_code.co_filename
        if (
            stop_at_backward
            and name.startswith(_TORCH)
            and frame.f_code.co_name in ("backward", "_engine_run_backward")
        ):
            break
        if name.startswith(_INSPECTOR) and frame.f_code.co_name == "_replay_calls":
            break
        if not _ours(name):
            out.append(f"{name}:{frame.f_lineno}")
        frame = frame.f_back
    return out


def _traceback_frames(lines: list[str]) -> list[str]:
    """``file:line`` of the user's frames in an anomaly-mode forward traceback, innermost first."""
    out = []
    for entry in reversed(lines):
        head = entry.strip().splitlines()[0] if entry.strip() else ""
        if not head.startswith('File "'):
            continue
        name, _, rest = head[6:].partition('", line ')
        line = rest.split(",")[0]
        if not _ours(name):
            out.append(f"{name}:{line}")
    return out


def _code_of(source: str) -> str:
    import linecache

    name, _, line = source.rpartition(":")
    return linecache.getline(name, int(line)).strip() if line.isdigit() else ""


def _tensors(value: Any, path: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _tensors(v, f"{path}[{i}]")


def _bad(t: torch.Tensor) -> bool:
    return (t.is_floating_point() or t.is_complex()) and t.numel() > 0 and not bool(torch.isfinite(t).all())


def _range(arg: str, t: torch.Tensor) -> InputRange:
    v = t.detach()
    if v.is_complex():
        v = v.abs()
    v = v.double() if v.is_floating_point() else v.to(torch.float64)
    if v.numel() == 0:
        return InputRange(arg, tuple(t.shape), str(t.dtype).removeprefix("torch."), math.nan, math.nan)
    low, high = torch.aminmax(v)
    return InputRange(arg, tuple(t.shape), str(t.dtype).removeprefix("torch."), float(low), float(high))


class _Finder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.modules: list[str] = []
        self.phase = "forward"
        self.count = {"forward": 0, "backward": 0}
        self.found: list[OpRecord] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        if getattr(func, "is_view", False) or name in _SKIP or "empty" in name:  # uninitialised memory
            return out
        outs = [t for _, t in _tensors(out if isinstance(out, (tuple, list)) else (out,))]
        if not any(t.is_floating_point() or t.is_complex() for t in outs):
            return out
        node = torch._C._current_autograd_node()
        phase = "backward" if node is not None else "forward"
        self.count[phase] += 1
        if sum(r.phase == phase for r in self.found) >= MAX_OPS or not any(_bad(t) for t in outs):
            return out
        ins = list(_tensors(list(args) + list(kwargs.values())))
        if any(_bad(t) for _, t in ins):
            return out  # it only carried a NaN/Inf it was given
        scalars = [
            a for a in list(args) + list(kwargs.values()) if isinstance(a, (int, float, complex, bool))
        ]
        infinite = any(isinstance(s, float) and math.isinf(s) for s in scalars)
        if infinite and (name.startswith(_FILLS) or not ins):
            return out  # an infinite constant it was asked to write (a mask), not a value that overflowed
        self.found.append(self._record(func, phase, node, ins, outs, scalars))
        return out

    def _record(
        self,
        func: Any,
        phase: str,
        node: Any,
        ins: list[tuple[str, torch.Tensor]],
        outs: list[torch.Tensor],
        scalars: list[Any],
    ) -> OpRecord:
        if phase == "forward":
            module = self.modules[-1] if self.modules else LOSS_LABEL
            frames = _user_frames(sys._getframe(2), False)
        else:
            module = node.metadata.get(_KEY, LOSS_LABEL)
            frames = _user_frames(sys._getframe(2), True) or _traceback_frames(
                node.metadata.get("traceback_", [])
            )
        bad = [t for t in outs if _bad(t)]
        nan = sum(int(torch.isnan(t).sum()) for t in bad)
        inf = sum(int(torch.isinf(t).sum()) for t in bad)
        source = frames[0] if frames else ""
        return OpRecord(
            phase,
            self.count[phase],
            str(func),
            module,
            source,
            _code_of(source),
            tuple(frames[:8]),
            tuple(_range(f"input{p}", t) for p, t in ins if t.is_floating_point() or t.is_complex()),
            tuple(bad[0].shape),
            str(bad[0].dtype).removeprefix("torch."),
            nan,
            inf,
            tuple(repr(s) for s in scalars),
        )


def _label(value: Any, name: str) -> None:
    """Mark every autograd node reachable from ``value``'s tensors and not marked yet with ``name``."""
    todo = [
        t.grad_fn
        for _, t in _tensors(value if isinstance(value, (tuple, list)) else (value,))
        if t.grad_fn is not None
    ]
    while todo:
        node: Any = todo.pop()
        if node is None:
            continue
        meta = node.metadata
        if _KEY in meta:
            continue
        meta[_KEY] = name
        todo.extend(n for n, _ in node.next_functions)


def _outputs(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict) or hasattr(value, "values"):
        try:
            return [t for v in value.values() for t in _outputs(v)]
        except Exception:  # noqa: BLE001 - a mapping-like output whose values() is not usable
            return []
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _outputs(v)]
    return []


@contextmanager
def finding_ops(model: nn.Module) -> Iterator[_Finder]:
    """Record the ops that made NaN/Inf from finite inputs while the block runs (forward and backward).

    Yields the finder; its ``found`` lists :class:`OpRecord` in the order they ran. Every hook and mode
    is gone when the block ends, also on an exception.
    """
    finder = _Finder()

    def pre(name: str) -> Any:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if (
                torch.is_grad_enabled()
            ):  # what the enclosing module made before this call is the enclosing one's
                _label(list(args) + _outputs(kwargs), finder.modules[-1] if finder.modules else LOSS_LABEL)
            finder.modules.append(name)

        return hook

    def post(name: str) -> Any:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            if finder.modules and finder.modules[-1] == name:
                finder.modules.pop()
            if torch.is_grad_enabled():
                _label(_outputs(output), name)

        return hook

    with ExitStack() as stack:
        for name, m in model.named_modules():
            label = name or ROOT_LABEL
            stack.callback(m.register_forward_pre_hook(pre(label), with_kwargs=True).remove)
            stack.callback(m.register_forward_hook(post(label)).remove)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # anomaly mode says it is on
            stack.enter_context(torch.autograd.detect_anomaly(check_nan=False))
        stack.enter_context(finder)
        yield finder
