"""What a replay found: :class:`Replay`, frozen, with its verdict in one line and as plain data."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ...capture import Captures
from ...utils.findings import Finding
from ..ops import OpRecord


@dataclass(frozen=True, eq=False)
class Replay:
    """What :func:`replay` found when it ran a kept step again.

    Attributes:
        run_path, step, rank: the run file, the step and the rank replayed.
        file: the replay file it read.
        reproduced: whether the replayed loss equals the one the run recorded, bit for bit (CPU) or
            within ``tolerance`` (relative, on a GPU); None when there is no loss to compare.
        loss: the loss of the step's last forward call as replayed (None without a loss function);
            ``losses``: one per forward call of the step.
        recorded_loss: the loss the run file (else the replay file) recorded at that step; when the replay
            computes the model's own loss (no ``loss`` given, none in the model file) and the step's last
            call returned one (``outputs.loss``), that one as the watch kept it.
        grad_norm, recorded_grad_norm: the total gradient norm replayed and the one the run recorded
            (:attr:`gradients_match` compares them).
        ops: the ops that made NaN/Inf from finite inputs, forward first, each in the order it ran.
        batch_nonfinite: the batch's floating inputs that already held NaN/Inf (the batch made them).
        weights_nonfinite: the kept parameters and buffers that already held NaN/Inf (written before).
        captures: every module's output and inputs as detached copies (within the byte budget).
        gradients: one row per parameter: ``name, norm, state`` (:func:`~inspector.gradient_norms`).
        findings: the culprits and what could not be compared, as findings.
        tolerance: the relative tolerance used for ``reproduced`` (0.0 on the CPU).
        notes: what the replay could not do as the step did (a batch written in place since, ...).
    """

    run_path: str
    step: int
    rank: int
    file: str
    reproduced: bool | None
    loss: float | None
    losses: tuple[float, ...]
    recorded_loss: float | None
    ops: tuple[OpRecord, ...]
    batch_nonfinite: tuple[str, ...]
    weights_nonfinite: tuple[str, ...]
    captures: Captures = field(repr=False)
    gradients: pd.DataFrame = field(repr=False)
    findings: tuple[Finding, ...] = ()
    tolerance: float = 0.0
    notes: tuple[str, ...] = ()
    grad_norm: float | None = None
    recorded_grad_norm: float | None = None

    @property
    def gradients_match(self) -> bool | None:
        """Whether the replayed step's total gradient norm is the one the run recorded (both NaN/Inf, or
        within 1e-4 relative: the two sum in another order); None when either is missing. A loop that
        scales each call's loss (accumulation) recorded the scaled gradients: they differ by that factor."""
        a, b = self.grad_norm, self.recorded_grad_norm
        if a is None or b is None:
            return None
        if not (math.isfinite(a) and math.isfinite(b)):
            return not math.isfinite(a) and not math.isfinite(b)
        return abs(a - b) <= 1e-4 * max(abs(a), abs(b))

    @property
    def first(self) -> OpRecord | None:
        """The first op that made NaN/Inf (the forward's, else the backward's)."""
        return self.ops[0] if self.ops else None

    def first_in(self, phase: str) -> OpRecord | None:
        return next((o for o in self.ops if o.phase == phase), None)

    def to_dict(self) -> dict[str, Any]:
        """The replay as plain data (the report's section and ``replay --json``): no tensors."""
        from dataclasses import asdict

        return {
            "run": self.run_path,
            "step": self.step,
            "rank": self.rank,
            "file": self.file,
            "reproduced": self.reproduced,
            "loss": self.loss,
            "losses": list(self.losses),
            "recorded_loss": self.recorded_loss,
            "grad_norm": self.grad_norm,
            "recorded_grad_norm": self.recorded_grad_norm,
            "gradients_match": self.gradients_match,
            "tolerance": self.tolerance,
            "verdict": self.verdict(),
            "ops": [asdict(o) for o in self.ops],
            "batch_nonfinite": list(self.batch_nonfinite),
            "weights_nonfinite": list(self.weights_nonfinite),
            "captured": list(self.captures.order),
            "gradients": self.gradients[["name", "norm", "state"]].to_dict("records"),
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
        }

    def verdict(self) -> str:
        """One line: reproduced or not, and where the first NaN/Inf came from."""
        rep = {True: "reproduced", False: "NOT reproduced", None: "no loss to compare"}[self.reproduced]
        if self.loss is not None and self.recorded_loss is not None:
            rep += f" (loss {self.loss!r}, recorded {self.recorded_loss!r})"
        if self.batch_nonfinite:
            cause = f"the batch held NaN/Inf in {', '.join(self.batch_nonfinite)}"
        elif self.weights_nonfinite:
            cause = f"the weights held NaN/Inf before the step: {', '.join(self.weights_nonfinite[:3])}"
        elif self.first is not None:
            cause = f"first NaN/Inf: {self.first.line()}"
        else:
            cause = "no op made NaN/Inf from finite inputs"
        return f"step {self.step}: {rep}; {cause}"
