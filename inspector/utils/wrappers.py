"""See through the modules that wrap a user's model: ``torch.compile``, DDP, DataParallel, FSDP.

``torch.compile(model)`` returns an ``OptimizedModule`` whose tensors are named
``_orig_mod.<name>``; ``DistributedDataParallel``, ``DataParallel`` and the first FSDP
(``FullyShardedDataParallel``) hold the model as ``.module``. Analyses run on the module
underneath, so names are those the user wrote and ties are compared on the tensors
themselves. Every function that takes a model unwraps it here, through
:func:`inspector.utils.checks.require_module`, however it is imported; :class:`LoadedModel` also
keeps a finding that says what wrapped the model.

FSDP2's ``fully_shard`` changes the module in place and adds no wrapper: nothing to do here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from torch import nn

from .findings import Finding


@functools.cache  # looked up at every step of a watch: the imports once
def _wrapper_classes() -> tuple[type, ...]:
    import torch

    classes: list[type] = [nn.DataParallel, nn.parallel.DistributedDataParallel]
    if torch.distributed.is_available():
        try:
            from torch.distributed.fsdp import FullyShardedDataParallel
        except ImportError:  # a build without FSDP
            pass
        else:
            classes.append(FullyShardedDataParallel)
    return tuple(classes)


def _inner(model: nn.Module) -> nn.Module | None:
    """The module one wrapper holds, or None when ``model`` is no wrapper."""
    if type(model).__name__ == "OptimizedModule":  # torch.compile (torch._dynamo's OptimizedModule)
        modules = model.__dict__.get("_modules")
        orig = modules.get("_orig_mod") if isinstance(modules, dict) else None
        return orig if isinstance(orig, nn.Module) else None
    if isinstance(model, _wrapper_classes()):
        inner = getattr(model, "module", None)
        return inner if isinstance(inner, nn.Module) else None
    return None


@dataclass(frozen=True)
class Unwrapped:
    """``module``: the model underneath; ``wrappers``: the wrapper classes, outermost first."""

    module: nn.Module
    wrappers: tuple[str, ...]

    @property
    def prefix(self) -> str:
        """What the wrappers add in front of every tensor name (``"_orig_mod."``, ``"module."``)."""
        return "".join("_orig_mod." if w == "OptimizedModule" else "module." for w in self.wrappers)

    def findings(self) -> list[Finding]:
        if not self.wrappers:
            return []
        chain = " inside ".join(self.wrappers)
        out = [Finding("model-wrapped", "info", "",
                       f"the model is wrapped in {chain}; the inspector looks at the "
                       f"{type(self.module).__name__} underneath, so names are yours (without "
                       f"{self.prefix!r}), ties are those of your tensors, and forward passes run "
                       "it eagerly")]
        flat = [n for n, _ in self.module.named_parameters() if n.rsplit(".", 1)[-1] == "_flat_param"]
        if flat:
            out.append(Finding("fsdp-flat-parameters", "warning", flat[0],
                               f"FSDP (use_orig_params=False) holds the parameters as {len(flat)} flat "
                               f"tensor(s) ({flat[0]}...): your parameter names, shapes and ties are not "
                               "visible. Wrap with use_orig_params=True, or shard with FSDP2's fully_shard"))
        return out


def unwrap(model: nn.Module) -> Unwrapped:
    """The model under any ``torch.compile`` / DDP / DataParallel / FSDP wrappers, and what they were.

    >>> import torch
    >>> m = nn.Linear(2, 2)
    >>> u = unwrap(torch.compile(m))
    >>> u.module is m, u.wrappers
    (True, ('OptimizedModule',))
    """
    wrappers: list[str] = []
    inner = _inner(model) if isinstance(model, nn.Module) else None
    while inner is not None:
        wrappers.append(type(model).__name__)
        model = inner
        inner = _inner(model)
    return Unwrapped(model, tuple(wrappers))


def underlying(model: Any) -> Any:
    """``unwrap(model).module`` for a module; anything else as it is."""
    if not isinstance(model, nn.Module) or _inner(model) is None:  # no wrapper (a watch's every step)
        return model
    return unwrap(model).module
