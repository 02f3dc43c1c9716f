"""Running a loaded model: whether its tensors can run a forward pass, its inputs moved to its
device, and the call itself."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from ..inventory import TensorInventory, tensor_inventory
from ..utils.findings import InspectorError


def offloaded_ids(model: nn.Module) -> set[int]:
    """ids of the meta tensors that accelerate's hooks load before each forward (weights that
    ``dispatch_model`` offloaded to the cpu or disk): they have weights, kept elsewhere."""
    return _offloaded(tensor_inventory(model))


def _offloaded(inv: TensorInventory) -> set[int]:
    """:func:`offloaded_ids` of the model walked by ``inv``."""
    own = inv.own_entries
    out: set[int] = set()
    for name, module in zip(inv.modules, inv.module_objects, strict=True):
        hook = getattr(module, "_hf_hook", None)
        hooks = getattr(hook, "hooks", None) or ([hook] if hook is not None else [])
        if any(getattr(h, "offload", False) and getattr(h, "weights_map", None) is not None for h in hooks):
            out.update(id(e.tensor) for e in own.get(name, ()) if e.device.type == "meta")
    return out


def unserved_meta(inv: TensorInventory) -> list[str]:
    """First names of the tensors on the meta device with no weights behind them (those
    accelerate offloaded and loads for each forward have weights)."""
    served = _offloaded(inv)
    return [e.name for e in inv.unique_entries() if e.device.type == "meta" and id(e.tensor) not in served]


def ensure_runnable(model: nn.Module, name: str = "model", inv: TensorInventory | None = None) -> None:
    """Refuse a forward pass on a model whose tensors are on the meta device (those accelerate
    offloaded and loads for each forward are fine); ``inv``: its inventory, where the caller has one."""
    meta = unserved_meta(tensor_inventory(model) if inv is None else inv)
    if meta:
        raise InspectorError(
            f"{name} is on the meta device ({len(meta)} tensors, first {meta[0]}): it has a structure "
            "but no numbers, so it cannot run a forward pass. Structure views (aliases, offsets, "
            "device maps) work; load it with a checkpoint on a real device to run it.")


def to_device(inputs: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """Move a tensor, or every tensor inside tuples, lists, dicts, named tuples and their subclasses, to
    ``device``.

    With ``dtype``, floating tensors are cast to it too (integer and bool tensors keep theirs).
    Anything that is not a tensor is returned as it is.

    >>> to_device((torch.ones(1), torch.ones(1, dtype=torch.long)), torch.device("cpu"),
    ...           torch.float16)[0].dtype
    torch.float16
    """
    def move(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor):
            cast = dtype is not None and leaf.is_floating_point()
            return leaf.to(device=device, dtype=dtype if cast else leaf.dtype)
        if isinstance(leaf, dict):  # a dict subclass pytree does not know (registered ones never get here)
            return _rebuild(leaf, {k: to_device(v, device, dtype) for k, v in leaf.items()})
        if isinstance(leaf, (list, tuple)):
            return _rebuild(leaf, [to_device(v, device, dtype) for v in leaf])
        return leaf

    return tree_map(move, inputs)


def _rebuild(original: Any, items: Any) -> Any:
    """``items`` as ``type(original)`` where that type is built from them, else as its plain base."""
    try:
        return type(original)(items)
    except Exception:  # noqa: BLE001 - a subclass with its own constructor: keep the contents
        base = dict if isinstance(original, dict) else list if isinstance(original, list) else tuple
        return base(items)


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model(inputs)`` for a tensor, ``model(*inputs)`` for a tuple, ``model(**inputs)`` for a dict."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)
