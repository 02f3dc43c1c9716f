"""Activation capture as detached copies, with in-place mutation detection.

- :mod:`.api`: :func:`capturing` (yields a :class:`CaptureBlock`) and :func:`capture_activations`
- :mod:`.results`: :class:`Captures`, :class:`Skipped`, :class:`Mutation`
- :mod:`.recorder`: the hooks (one copy and an O(1) record per module output); :mod:`.budget`:
  the byte budget and the findings about what it left out
- :mod:`.watch`: which live outputs were written in place after their copy
- :mod:`.storage`: the copies (same device, or pinned CPU memory on a side stream from CUDA)
- :mod:`.stats`: value statistics, computed after the forward pass
- :mod:`.select`: which modules to capture
- :mod:`.compare`: live tensor vs copy, and bare references vs copies (:func:`reference_drift`)

Modules: ``leaves``: tensor leaves of structured values.
"""

from __future__ import annotations

from .api import CaptureBlock, capture_activations, capturing
from .compare import DRIFT_COLUMNS, reference_drift
from .leaves import first_tensor, tensor_leaves
from .results import SKIPPED_COLUMNS, Captures, Mutation, Skipped
from .select import select_modules
from .stats import STATS_COLUMNS, tensor_stats

__all__ = ["DRIFT_COLUMNS", "SKIPPED_COLUMNS", "STATS_COLUMNS", "CaptureBlock", "Captures", "Mutation",
           "Skipped", "capture_activations", "capturing", "first_tensor", "reference_drift", "select_modules",
           "tensor_leaves", "tensor_stats"]
