"""Where each parameter sits in the flat vector, and how big its gradient is.

``torch.nn.utils.parameters_to_vector(model.parameters())`` concatenates every Parameter
object once, in registration order, frozen ones included.

- :mod:`.map`: :func:`offset_map` (offsets from metadata alone, meta tensors included),
  :func:`locate` (the parameter and element behind a flat index), :func:`offset_findings`,
  :func:`vector_lengths`.
- :mod:`.gradients`: :func:`gradient_report` and :func:`gradient_norms`, per parameter and
  per module from one pass over the gradients (:mod:`.gradient_pass`; the rows and module
  sums in :mod:`.gradient_rows`).
- :mod:`.backward`: :func:`run_backward` (sets ``.grad``) and :func:`loss_gradients`
  (gradients kept apart from the model).
- :mod:`.roundtrip`: :func:`flatten_roundtrip`, ``parameters_to_vector`` and back on copies.

Modules: ``_tables``: column lists and typed table building.
"""

from __future__ import annotations

from ._tables import MODULE_NORM_COLUMNS, OFFSET_COLUMNS, PARAMETER_NORM_COLUMNS, ROOT, STATES
from .backward import BackwardResult, LossGradients, loss_gradients, run_backward
from .gradient_pass import Pieces, gradient_l2_norms
from .gradients import GradientNorms, gradient_norms, gradient_report, state_counts
from .map import Location, display_table, locate, offset_findings, offset_map, vector_lengths
from .roundtrip import RoundTrip, flatten_roundtrip

__all__ = [
    "MODULE_NORM_COLUMNS", "OFFSET_COLUMNS", "PARAMETER_NORM_COLUMNS", "ROOT", "STATES",
    "BackwardResult", "GradientNorms", "Location", "LossGradients", "Pieces", "RoundTrip",
    "display_table", "flatten_roundtrip", "gradient_l2_norms", "gradient_norms", "gradient_report",
    "locate", "loss_gradients", "offset_findings", "offset_map", "run_backward", "state_counts",
    "vector_lengths",
]
