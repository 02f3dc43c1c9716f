"""``replay(run_path, step, model=...)``: run a kept step again under full inspection.

The weights the step's forward used go into the model (in place, under ``no_grad``), the generators
and the autocast state are set as they were when each of its forward calls began, the modules' modes
too; then each call runs forward and backward again, with every module's output (and inputs) copied
(:func:`~inspector.capture.capturing`, within its byte budget) and every op checked for the first
NaN/Inf it made (:mod:`.ops`). Afterwards the model is as it was: its weights, buffers, gradients,
modes, attributes and the generators are put back (what the user's own hooks did during the replay,
such as a counter of calls, is theirs).

Modules: ``result``: :class:`Replay`, what a replay found; ``kept``: the replay file that kept the step,
the model and what the run recorded; ``forward``: the kept calls run again, everything put back
(:func:`versions_kept`); ``step``: :func:`replay` itself, its comparisons and findings.
"""

from __future__ import annotations

from .forward import versions_kept
from .result import Replay
from .step import CAPTURE_BYTES, replay

__all__ = ["CAPTURE_BYTES", "Replay", "replay", "versions_kept"]
