"""What a capture returns: :class:`Captures`, and its :class:`Skipped` and :class:`Mutation` records."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

from ..utils.findings import Finding
from .leaves import tensor_leaves
from .stats import stats_frame

SKIPPED_COLUMNS = ["module", "kind", "path", "bytes", "reason"]


@dataclass(frozen=True)
class Skipped:
    """Something that was not captured, and why.

    ``kind`` is ``"output"``, ``"input"`` or ``"grad"``; ``path`` names the leaf inside a
    structured output (``""`` for the whole value); ``bytes`` is its size (0 if unknown).
    """

    module: str
    kind: str
    path: str
    bytes: int
    reason: str


@dataclass(frozen=True)
class Mutation:
    """A live module output that changed after its capture.

    ``by`` is the module after whose forward the change was first seen (``None`` if it
    happened outside any module or could not be told); ``how`` is ``"version"`` (the
    version counter moved) or ``"value"`` (inference tensors: compared with the copy).
    """

    module: str
    path: str
    by: str | None
    how: str
    max_abs_change: float | None


@dataclass(frozen=True, eq=False)
class Captures:
    """What :func:`capture_activations` recorded.

    Attributes:
        outputs: module name -> detached copy of its output, structure kept (tuples,
            lists, dicts, Hugging Face model outputs). A module called twice in one
            forward pass gives ``name`` and ``name#2``.
        inputs: the same for module inputs (only with ``keep_inputs=True``).
        grads: module name -> copy of the gradient of its output (``grads=True``).
        mutated: module name -> what overwrote its live output (the next module that ran,
            or ``None`` when that cannot be told); empty, not checked, when
            ``mutations_watched`` is False.
        mutations: one :class:`Mutation` per changed tensor leaf.
        skipped: what the byte budget or non-tensor outputs left out, with sizes.
        references: module name -> the bare live output a naive hook would have kept
            (only with ``keep_references=True``, for teaching).
        order: capture keys in the order the modules ran.
        findings: problems worth telling the user.
        store_on: where the copies live.
        model_output: what the forward pass returned (functional form only).
        placements: module name -> what its captured output is when the module computed a
            DTensor (tensor parallel): ``"piece of rank 1 ..."`` or ``"whole output ..."``.
        mutations_watched: whether in-place writes to the live outputs were watched (False with
            ``watch_mutations=False``, with a ``mutation-watch-off`` finding).

    Built once, complete, when the capture ends (the recorder collects, then builds it).
    """

    outputs: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)
    grads: dict[str, Any] = field(default_factory=dict)
    mutated: dict[str, str | None] = field(default_factory=dict)
    mutations: list[Mutation] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    references: dict[str, Any] = field(default_factory=dict, repr=False)
    order: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    store_on: str = "cpu"
    model_output: Any = field(default=None, repr=False, compare=False)
    placements: dict[str, str] = field(default_factory=dict)
    mutations_watched: bool = True
    # where the captures came from, given when they are built (a watched run's step and rank)
    _state: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @cached_property
    def stats(self) -> pd.DataFrame:
        """One row per captured tensor leaf: module, kind, path, shape, dtype, device, bytes,
        mean, std, min, max, nan, inf, zero_fraction, mutated."""
        return stats_frame({"output": self.outputs, "input": self.inputs, "grad": self.grads},
                           self.mutated)

    @property
    def skipped_table(self) -> pd.DataFrame:
        """``skipped`` as a DataFrame (module, kind, path, bytes, reason)."""
        return pd.DataFrame([s.__dict__ for s in self.skipped], columns=SKIPPED_COLUMNS)

    @property
    def total_bytes(self) -> int:
        """Bytes held by the copies (outputs, inputs and grads)."""
        return sum(t.numel() * t.element_size() for store in (self.outputs, self.inputs, self.grads)
                   for v in store.values() for _, t in tensor_leaves(v))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe summary: stats rows, mutated modules, skipped items, findings (no tensors)."""
        return {
            "store_on": self.store_on,
            "modules": list(self.order),
            "bytes": self.total_bytes,
            "stats": [{k: _json_value(v) for k, v in row.items()}
                      for row in self.stats.to_dict("records")],
            "mutated": dict(self.mutated),
            "mutations": [{**m.__dict__, "max_abs_change": _json_value(m.max_abs_change)}
                          for m in self.mutations],
            "skipped": [s.__dict__.copy() for s in self.skipped],
            "findings": [f.to_dict() for f in self.findings],
        }


def _json_value(v: Any) -> Any:
    if hasattr(v, "item") and not isinstance(v, (str, bytes)):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v
