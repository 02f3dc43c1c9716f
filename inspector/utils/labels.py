"""The labels that stand for things without a name of their own, the same in every table, figure,
finding and file: the model itself (its root module, named ``""``) and the batch given to it."""

from __future__ import annotations

ROOT_LABEL = "(model)"  # the root module, and the tensors held by the model itself
BATCH_LABEL = "(batch)"  # the inputs given to the model's forward


def module_label(name: str) -> str:
    """``name``, or :data:`ROOT_LABEL` for the root module's empty name.

    >>> module_label(""), module_label("fc")
    ('(model)', 'fc')
    """
    return name or ROOT_LABEL
