"""The replay file's record: :class:`ReplayMeta` (the run, the weights' names, the steps kept), its
:class:`KeptStep` and :class:`KeptCall` parts, written once as JSON (floats as ``float.hex``, so a loss
comes back bit for bit), and the limits a file is read within."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

FORMAT = "inspector-replay"
VERSION = 1
SUFFIX = ".replay.safetensors"
MAX_STEPS = 64  # steps one file may hold
MAX_CALLS = 4096  # forward calls one step may hold
MAX_NAMES = 4_000_000  # weight names (the run file's MAX_PARAMETERS)
_NAME = 4096  # characters of one name


@dataclass(frozen=True)
class KeptCall:
    """One training forward call: its structure (:mod:`.calls`), the generators' states as it began
    (device -> tensor key), the autocast state (device type -> dtype name, where enabled) and the
    modules that were in eval mode."""

    args: Any
    kwargs: Any
    rng: dict[str, str]
    autocast: dict[str, str]
    eval_modules: tuple[str, ...]
    written: tuple[str, ...] = ()  # batch tensors written in place after the step (their paths)
    loss: float | None = None  # the model's own loss (``outputs.loss``) of that call, when it gave one


@dataclass(frozen=True)
class KeptStep:
    """One step: its calls, whether its weights are in the file, the loss the watch read (or None)."""

    step: int
    calls: tuple[KeptCall, ...]
    weights: bool
    loss: float | None


@dataclass(frozen=True)
class ReplayMeta:
    """The record of a replay file: the run it belongs to (file name, model name, rank, world), the
    weights' names, the step whose error findings made it and those findings, the steps kept."""

    run: str
    model: str
    rank: int
    world: int
    parameters: tuple[str, ...]
    buffers: tuple[str, ...]
    step: int
    findings: tuple[tuple[str, str, str, str], ...]  # (code, severity, where, message)
    steps: tuple[KeptStep, ...]

    def kept(self, step: int) -> KeptStep | None:
        return next((s for s in self.steps if s.step == step), None)

    def to_json(self) -> str:
        def call(c: KeptCall) -> dict[str, Any]:
            return {
                "args": c.args,
                "kwargs": c.kwargs,
                "rng": c.rng,
                "autocast": c.autocast,
                "eval": list(c.eval_modules),
                "written": list(c.written),
                "loss": _hex(c.loss),
            }

        return json.dumps(
            {
                "run": self.run,
                "model": self.model,
                "rank": self.rank,
                "world": self.world,
                "parameters": list(self.parameters),
                "buffers": list(self.buffers),
                "step": self.step,
                "findings": [list(f) for f in self.findings],
                "steps": [
                    {
                        "step": s.step,
                        "calls": [call(c) for c in s.calls],
                        "weights": s.weights,
                        "loss": _hex(s.loss),
                    }
                    for s in self.steps
                ],
            },
            allow_nan=False,
        )


def _hex(x: float | None) -> str | None:
    return None if x is None else float(x).hex()
