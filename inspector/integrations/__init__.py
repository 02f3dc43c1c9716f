"""The watch inside the training stacks people use, and its numbers in the trackers they follow.

Each integration is two lines in a training script and imports its stack only when asked for:

- ``hf_trainer``: :class:`WatchCallback` (a ``transformers.TrainerCallback``) and :func:`watch_trainer`;
- ``pl_callback``: :class:`LightningWatch` (a PyTorch Lightning ``Callback``);
- ``accelerate_loop``: :func:`watch_accelerator` around an accelerate loop;
- ``trackers``: :class:`TensorBoardExport`, :class:`WandbExport`, :class:`MlflowExport`;
- ``follow``: :class:`RunFollower` reads the steps appended to a growing run file;
- ``session``: :class:`WatchedTraining`, what they share (print findings, stop on an error,
  export after each step), and :class:`TrainingStopped`.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .follow import RunFollower, StepRow
from .session import TrainingStopped, WatchedTraining
from .trackers import MlflowExport, TensorBoardExport, WandbExport

_LAZY = {"WatchCallback": "hf_trainer", "watch_trainer": "hf_trainer", "LightningWatch": "pl_callback",
         "watch_accelerator": "accelerate_loop"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["LightningWatch", "MlflowExport", "RunFollower", "StepRow", "TensorBoardExport", "TrainingStopped",
           "WandbExport", "WatchCallback", "WatchedTraining", "watch_accelerator", "watch_trainer"]
