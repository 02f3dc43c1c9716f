"""Which submodules a capture watches: names, glob patterns, classes or class names."""

from __future__ import annotations

import difflib
import fnmatch
from typing import Any

from torch import nn

from ..utils.findings import InspectorError


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
    return select_from(model, list(model.named_modules()), modules)


def select_from(
    model: nn.Module, named_modules: list[tuple[str, nn.Module]], modules: Any
) -> dict[str, nn.Module]:
    """:func:`select_modules` over an existing ``named_modules()`` list (one walk per capture)."""
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
