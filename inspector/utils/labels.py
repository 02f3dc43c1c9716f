"""The labels that stand for things without a name of their own, the same in every table, figure,
finding and file: the model itself (its root module, named ``""``), the batch given to it and the loss
logged for it; and the one order of names that reads their numbers as numbers (``h.2`` before ``h.10``)."""

from __future__ import annotations

import re
from collections.abc import Sequence

ROOT_LABEL = "(model)"  # the root module, and the tensors held by the model itself
BATCH_LABEL = "(batch)"  # the inputs given to the model's forward
LOSS_LABEL = "(loss)"  # the loss logged with w.log(loss=...), computed outside any module


def module_label(name: str) -> str:
    """``name``, or :data:`ROOT_LABEL` for the root module's empty name.

    >>> module_label(""), module_label("fc")
    ('(model)', 'fc')
    """
    return name or ROOT_LABEL


def listed(names: Sequence[str], most: int = 3) -> str:
    """The first ``most`` of ``names`` as labels, and how many more: ``"a, b, c and 4 more"``."""
    shown = ", ".join(module_label(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def natural_key(name: str) -> list[tuple[int, int | str]]:
    """Sort key that reads the numbers in a name as numbers.

    >>> sorted(["h.10.w", "h.2.w", "emb"], key=natural_key)
    ['emb', 'h.2.w', 'h.10.w']
    """
    return [(0, int(part)) if part.isdigit() else (1, part) for part in re.split(r"(\d+)", name) if part]
