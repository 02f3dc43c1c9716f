"""Follow a growing watch run file: each call hands back the steps appended since the last one.

The run file is an Arrow IPC stream (the watch writes its steps at most 0.5 s after they end);
:class:`RunFollower` keeps its byte offset and reads only the new messages (checked,
:mod:`inspector.runfiles.guard`), so following a run costs one small read per step whatever its length.
Used by the tracker exports (:mod:`.trackers`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..runfiles import RunMeta
from ..runfiles.tail import RunTail
from ..utils.findings import InspectorError


@dataclass(frozen=True)
class StepRow:
    """One rank's numbers at one step, as the tracker exports need them."""

    step: int
    rank: int
    loss: float | None
    grad_norm: float | None
    nonfinite: int
    lr: list[float]
    scale: float | None
    module_grad_norm: np.ndarray | None
    module_update_ratio: np.ndarray | None
    module_nonfinite: np.ndarray | None
    findings: list[dict[str, str]]


class RunFollower:
    """Reads the steps a watch appends to ``path``; :meth:`new_rows` returns those not seen yet.

    Reading goes through :class:`~inspector.runfiles.tail.RunTail` (checked as every run file is read;
    nothing is kept between calls but the offset and the schema)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self._tail = RunTail(path, keep=False)

    @property
    def meta(self) -> RunMeta | None:
        return self._tail.meta

    def new_rows(self) -> list[StepRow]:
        """The rows appended since the last call ([] while the file is missing, its header not whole,
        or it is not a run file that can be read)."""
        try:
            self._tail.poll()
        except InspectorError:
            return []
        return [row for batch in self._tail.fresh for row in _rows(batch)]


def _array(value: Any, dtype: Any) -> np.ndarray | None:
    return None if value is None else np.asarray(value, dtype=dtype)


def _rows(batch: Any) -> list[StepRow]:
    columns = {name: batch.column(name).to_pylist() for name in (
        "step", "rank", "loss", "grad_norm", "nonfinite", "lr", "scale", "module_grad_norm",
        "module_update_ratio", "module_nonfinite", "findings")}
    out = []
    for i in range(batch.num_rows):
        c = {k: v[i] for k, v in columns.items()}
        out.append(StepRow(
            step=int(c["step"]), rank=int(c["rank"]), loss=c["loss"], grad_norm=c["grad_norm"],
            nonfinite=int(c["nonfinite"] or 0), lr=list(c["lr"] or []), scale=c["scale"],
            module_grad_norm=_array(c["module_grad_norm"], np.float32),
            module_update_ratio=_array(c["module_update_ratio"], np.float32),
            module_nonfinite=_array(c["module_nonfinite"], np.int64),
            findings=list(c["findings"] or []),
        ))
    return out


__all__ = ["RunFollower", "StepRow"]
