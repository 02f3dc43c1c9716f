"""One forward call as the model took it, flattened for a file: its tensors, and its structure as JSON.

A call's structure is a tree of plain JSON nodes, nothing else: ``{"t": key}`` (a tensor, stored under
``key``), ``{"v": value}`` (an int, float, bool, str or None), ``{"list": [...]}``, ``{"tuple": [...]}``
and ``{"dict": [[key, node], ...]}`` (string keys). Anything else in a batch (a custom object) cannot be
kept, and is named. Read back, the tree is checked node by node before anything is built: nothing in
a replay file is ever executed or imported.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..utils.findings import InspectorError

MAX_DEPTH = 32  # nesting of lists, tuples and dicts in one call
MAX_NODES = 100_000  # nodes in one call's tree
MAX_TEXT = 4096  # characters of one string value or key


class Unkeepable(Exception):
    """A value of the batch that a replay file cannot hold (its path and type are the message)."""


def flatten(value: Any, prefix: str, tensors: dict[str, torch.Tensor], path: str = "", depth: int = 0) -> Any:
    """The JSON tree of ``value``; its tensors go into ``tensors`` under ``prefix`` + a running number
    (references: nothing is copied here; a tensor given twice, such as ``input_ids`` as ``labels``, once)."""
    if depth > MAX_DEPTH:
        raise Unkeepable(f"{path or 'the call'} is nested deeper than {MAX_DEPTH}")
    if isinstance(value, torch.Tensor):
        key = next((k for k, t in tensors.items() if t is value), None)
        if key is None:
            key = f"{prefix}{len(tensors)}"
            tensors[key] = value
        return {"t": key}
    if value is None or isinstance(value, (bool, int, str)):
        return {"v": value}
    if isinstance(value, float):
        return {"v": value if math.isfinite(value) else repr(value), "f": True}
    if isinstance(value, (list, tuple)) and type(value) in (list, tuple):
        kind = "list" if isinstance(value, list) else "tuple"
        return {kind: [flatten(v, prefix, tensors, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {
            "dict": [[k, flatten(v, prefix, tensors, f"{path}[{k!r}]", depth + 1)] for k, v in value.items()]
        }
    raise Unkeepable(
        f"{path or 'the call'} is a {type(value).__name__}, which a replay file cannot hold "
        "(tensors, numbers, strings, None, lists, tuples and dicts with string keys only)"
    )


def rebuild(
    node: Any, tensors: dict[str, torch.Tensor], where: str, count: list[int] | None = None, depth: int = 0
) -> Any:
    """The value a tree :func:`flatten` made stands for, checked node by node.

    Raises:
        InspectorError: naming ``where`` (the file) and the first node that is not one of the five kinds.
    """
    count = [0] if count is None else count
    count[0] += 1
    if count[0] > MAX_NODES or depth > MAX_DEPTH:
        raise InspectorError(
            f"{where}: a call's structure is larger than {MAX_NODES} nodes or deeper than "
            f"{MAX_DEPTH}; not a file the watch wrote"
        )
    if not isinstance(node, dict) or len(node) not in (1, 2):
        raise InspectorError(
            f"{where}: a call's structure holds {type(node).__name__} {str(node)[:60]!r} "
            "where a node is expected; not a file the watch wrote"
        )
    if "t" in node and len(node) == 1:
        key = node["t"]
        if not isinstance(key, str) or key not in tensors:
            raise InspectorError(
                f"{where}: a call refers to tensor {str(key)[:60]!r}, which the file does not "
                "hold; the file is damaged or forged"
            )
        return tensors[key]
    if "v" in node:
        value = node["v"]
        if set(node) == {"v", "f"}:
            if isinstance(value, str) and value in ("inf", "-inf", "nan"):
                return float(value)
            if isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)):
                return float(value)
        elif len(node) == 1 and (
            value is None
            or isinstance(value, (bool, int, float))
            or (isinstance(value, str) and len(value) <= MAX_TEXT)
        ):
            return value
        raise InspectorError(
            f"{where}: a call holds the value {str(value)[:60]!r}, which is not a number, "
            "a short string or None; not a file the watch wrote"
        )
    ((kind, items),) = node.items() if len(node) == 1 else ((None, None),)
    if kind in ("list", "tuple") and isinstance(items, list):
        out = [rebuild(v, tensors, where, count, depth + 1) for v in items]
        return out if kind == "list" else tuple(out)
    if kind == "dict" and isinstance(items, list):
        built = {}
        for pair in items:
            if not (
                isinstance(pair, list)
                and len(pair) == 2
                and isinstance(pair[0], str)
                and len(pair[0]) <= MAX_TEXT
            ):
                raise InspectorError(
                    f"{where}: a dict in a call has an entry that is not [string key, node]; "
                    "not a file the watch wrote"
                )
            built[pair[0]] = rebuild(pair[1], tensors, where, count, depth + 1)
        return built
    raise InspectorError(
        f"{where}: a call's structure has a node of kind {str(kind)[:40]!r}; not a file the watch wrote"
    )


def as_inputs(args: tuple, kwargs: dict) -> Any:
    """The call as the project's ``inputs`` (what ``call_model`` and ``loss(outputs, inputs)`` take): the
    tensor of a one-argument call, the kwargs of a keyword-only call, else the tuple of arguments."""
    if not args and kwargs:
        return dict(kwargs)
    if len(args) == 1 and not kwargs:
        return args[0]
    return tuple(args)


def floating_leaves(value: Any, path: str = "") -> list[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` of each floating tensor in a rebuilt call (``[0]``, ``['x']``, ...)."""
    if isinstance(value, torch.Tensor):
        return [(path or "input", value)] if value.is_floating_point() or value.is_complex() else []
    if isinstance(value, (list, tuple)):
        return [x for i, v in enumerate(value) for x in floating_leaves(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [x for k, v in value.items() for x in floating_leaves(v, f"{path}[{k!r}]")]
    return []
