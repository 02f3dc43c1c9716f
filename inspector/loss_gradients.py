"""Gradients of a model's loss kept apart from the model: :func:`inspector.offsets.loss_gradients`.

The code lives in :mod:`inspector.offsets.backward`; these names stay importable from here.
"""

from __future__ import annotations

from .offsets.backward import LossGradients, Progress, loss_gradients

__all__ = ["LossGradients", "Progress", "loss_gradients"]
