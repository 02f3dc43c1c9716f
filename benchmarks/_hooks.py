"""The hand-written capture the benchmarks measure the inspector against: a forward hook on every module.

    from _hooks import hooked, clone   # a script in benchmarks/ has this folder on sys.path
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn


def clone(t: torch.Tensor) -> torch.Tensor:
    """What people keep from a hook today: ``output.detach().clone()``."""
    return t.detach().clone()


def hooked(
    model: nn.Module, run: Callable[[], object], keep: Callable[[torch.Tensor], object] | None
) -> dict:
    """Run ``run()`` with a forward hook on every module of ``model`` that stores ``keep(output)``
    (each tensor item of a tuple, list, dict or Hugging Face model output), or does nothing when
    ``keep`` is None (the floor). The model itself gets a hook that keeps nothing, as
    ``capture_activations`` watches but does not copy the model's own output.
    Returns module name -> what was kept; the hooks are removed whatever happens."""
    store: dict[str, object] = {}
    handles = []
    try:
        for name, module in model.named_modules():
            def hook(m, a, out, name=name):
                if keep is None or not name:  # the model's own output is not a module capture
                    return
                if isinstance(out, torch.Tensor):
                    store[name] = keep(out)
                elif isinstance(out, (tuple, list)):
                    store[name] = [keep(o) if isinstance(o, torch.Tensor) else o for o in out]
                elif isinstance(out, Mapping):  # dicts and Hugging Face model outputs
                    store[name] = {k: keep(v) if isinstance(v, torch.Tensor) else v for k, v in out.items()}
            handles.append(module.register_forward_hook(hook))
        run()
    finally:
        for h in handles:
            h.remove()
    return store
