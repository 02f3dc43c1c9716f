"""Eval mode for the call, and every flag, gradient and hook put back afterwards."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..utils.findings import Finding
from ..utils.forward_state import module_state_kept

#: The attribute transformers sets on a model once it has installed its output-capturing hooks
#: (lazily, on the first forward that needs hidden states); it never installs them again while set.
CAPTURE_MARK = "_output_capturing_hooks_installed"
_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
               "_backward_pre_hooks")


class preserved_state:  # noqa: N801 - used as a context manager, like contextlib's
    """Run in eval mode; afterwards restore every module's training flag, the attributes and
    buffers its forward rebinds or writes, the tensors' ``requires_grad``, the parameters'
    ``.grad`` and remove any hook added meanwhile.

    Eval mode keeps BatchNorm's running statistics unchanged and dropout off. Hooks added
    meanwhile are found by their handle id: ids only grow, so a hook whose id is at least
    the next id at entry is new (nothing is scanned when no hook was registered at all).
    ``modules`` may pass ``list(model.modules())`` when the caller has walked it already;
    ``enable_grad`` also turns gradient computation on inside (as ``torch.enable_grad()``).

    >>> lin = nn.Linear(2, 1).train()
    >>> with preserved_state(lin, []):
    ...     _ = lin.register_forward_hook(lambda *a: None)
    ...     lin.training
    False
    >>> lin.training, len(lin._forward_hooks)
    (True, 0)
    """

    __slots__ = ("model", "tensors", "findings", "modules", "enable_grad", "modes", "grads", "flags",
                 "hook_id", "grad_switched", "marked", "kept")

    def __init__(self, model: nn.Module, tensors: list[torch.Tensor],
                 findings: list[Finding] | None = None, *, modules: list[nn.Module] | None = None,
                 enable_grad: bool = False) -> None:
        self.model, self.tensors, self.findings = model, tensors, findings
        self.modules = module_list(model) if modules is None else modules
        self.enable_grad = enable_grad

    def __enter__(self) -> None:
        modules = self.modules
        self.modes = modes = [m.training for m in modules]
        self.grads = [(p, p.grad) for m in modules for p in m._parameters.values() if p is not None]
        self.flags = [(t, t.requires_grad) for t in self.tensors]
        self.hook_id = RemovableHandle.next_id
        self.marked = {id(m) for m in modules if m.__dict__.get(CAPTURE_MARK)}
        self.kept = module_state_kept([("", m) for m in modules])  # what the forward rebinds or writes
        self.kept.__enter__()
        if self.model.training and self.findings is not None:
            self.findings.append(Finding("eval-mode", "info", "",
                                         "the model was in training mode; attribution ran in eval mode "
                                         "(BatchNorm statistics frozen, dropout off) and training mode "
                                         "was restored"))
        if any(modes):
            self.model.eval()
        self.grad_switched = self.enable_grad and not torch.is_grad_enabled()
        if self.grad_switched:
            torch.set_grad_enabled(True)

    def __exit__(self, *exc: object) -> None:
        self.kept.__exit__(None, None, None)
        if self.grad_switched:
            torch.set_grad_enabled(False)
        modules, modes = self.modules, self.modes
        if [m.training for m in modules] != modes:
            for m, mode in zip(modules, modes, strict=True):
                if m.training != mode:
                    object.__setattr__(m, "training", mode)  # what Module.__setattr__ does for a bool
        start = self.hook_id
        # some hook was registered meanwhile only if the next handle id moved
        removed = _remove_hooks_since(modules, start) if RemovableHandle.next_id != start else 0
        if removed:  # transformers marks a model whose output-capturing hooks it installed: unmark it
            for m in modules:
                if m.__dict__.get(CAPTURE_MARK) and id(m) not in self.marked:
                    del m.__dict__[CAPTURE_MARK]
        for p, g in self.grads:
            if p.grad is not g:
                p.grad = g
        for t, flag in self.flags:
            if t.requires_grad != flag and t.is_leaf:
                t.requires_grad_(flag)
        if removed and self.findings is not None:
            self.findings.append(
                Finding(
                    "hook-removed",
                    "warning",
                    "",
                    f"{removed} hook(s) added during the call (by captum, or transformers' output "
                    "capturing, which adds them again when needed) were removed",
                )
            )


def _remove_hooks_since(modules: list[nn.Module], start: int) -> int:
    """Remove every hook whose handle id is at least ``start``; how many were removed."""
    removed = 0
    for m in modules:
        for d in map(m.__dict__.get, _HOOK_DICTS):
            # hooks are added at either end of their dict (appended, or prepended), so a
            # dict holds a new one only if its first or its last key is new
            if d and (_is_new(next(iter(d)), start) or _is_new(next(reversed(d)), start)):
                new = [k for k in d if _is_new(k, start)]
                for k in new:
                    del d[k]
                removed += len(new)
    return removed


def _is_new(key: Any, start: int) -> bool:
    return isinstance(key, int) and key >= start


def module_list(model: nn.Module) -> list[nn.Module]:
    """``list(model.modules())``: same order, each module once (an explicit stack instead of
    nested generators, which cost more on every call)."""
    out: list[nn.Module] = []
    seen: set[int] = set()
    stack: list[nn.Module | None] = [model]
    while stack:
        m = stack.pop()
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        out.append(m)
        children = m._modules
        if children:
            stack.extend(reversed(children.values()))
    return out
