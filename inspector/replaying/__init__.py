"""Replay the step that broke: keep the last steps of a watched run, and run one again under full inspection.

Modules: ``keeping``: :class:`StepKeeper`, what the watch keeps of its last steps (references to the
batch, the generators' states; the weights only when a pre-step error is seen); ``calls``: one forward
call's structure as plain JSON, checked when read; ``files``: the replay file next to the run file
(safetensors and one :class:`ReplayMeta` record), read as untrusted input; ``ops``: the ops that made
NaN/Inf from finite inputs, found by a dispatch mode active only during a replay; ``run``:
:func:`replay` and its frozen :class:`Replay`; ``live``: :func:`replay_live`, a replay on a model a watch
still follows (``Watch.replay``).
"""

from __future__ import annotations

from .files import (
    FORMAT,
    SUFFIX,
    KeptCall,
    KeptStep,
    ReplayFile,
    ReplayMeta,
    kept_steps,
    replay_files,
    replay_path,
)
from .keeping import StepKeeper
from .live import inspector_hooks_off, replay_live
from .ops import InputRange, OpRecord, finding_ops
from .run import Replay, replay

__all__ = [
    "FORMAT",
    "SUFFIX",
    "InputRange",
    "KeptCall",
    "KeptStep",
    "OpRecord",
    "Replay",
    "ReplayFile",
    "ReplayMeta",
    "StepKeeper",
    "finding_ops",
    "inspector_hooks_off",
    "kept_steps",
    "replay",
    "replay_files",
    "replay_live",
    "replay_path",
]
