"""Tensor leaves of structured values (tuples, lists, dicts, Hugging Face model outputs)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.utils._pytree as pytree

KEEP_AS_IS = (type(None), bool, int, float, complex, str, torch.Size, torch.dtype, torch.device)


def tensor_leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor inside a structured value.

    >>> [p for p, _ in tensor_leaves((torch.ones(1), {"a": torch.zeros(2)}))]
    ['[0]', "[1]['a']"]
    """
    if isinstance(value, torch.Tensor):
        yield prefix, value
        return
    leaves, _ = pytree.tree_flatten_with_path(value)
    for keypath, leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            yield prefix + pytree.keystr(keypath), leaf


def first_tensor(value: Any) -> torch.Tensor:
    """The first tensor of a value (the value itself when it is one).

    Raises:
        ValueError: the value holds no tensor.
    """
    for _, t in tensor_leaves(value):
        return t
    raise ValueError("the capture holds no tensor")


def top_tensors(value: Any) -> Iterator[torch.Tensor]:
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


def flat(value: Any) -> tuple[list[Any], Any, list[str] | None]:
    """(leaves, spec, paths): a fast path for a tensor and for flat tuples and lists of
    tensors; pytree for anything else (spec None means the value is one tensor)."""
    if isinstance(value, torch.Tensor):
        return [value], None, None
    if type(value) in (tuple, list) and all(isinstance(v, torch.Tensor) or v is None for v in value):
        return list(value), type(value), [f"[{i}]" for i in range(len(value))]
    leaves, spec = pytree.tree_flatten(value)
    return leaves, spec, None


def unflat(out: list[Any], spec: Any) -> Any:
    """The inverse of :func:`flat`."""
    if spec is None:
        return out[0]
    if spec in (tuple, list):
        return spec(out)
    return pytree.tree_unflatten(out, spec)


def leaf_paths(value: Any, spec: Any) -> list[str]:
    """The path of every leaf :func:`flat` returned for ``value`` (pytree order)."""
    if spec is None:
        return [""]
    return [pytree.keystr(p) for p, _ in pytree.tree_flatten_with_path(value)[0]]
