"""Compare two models, checkpoints or training runs: what changed, where, and what it means.

:func:`compare` takes two of anything the loader takes (``sample:``, ``FILE.py:factory``,
``hf:`` folders, ``.safetensors``/``.pt``/``.bin`` files, ``torch.distributed.checkpoint``
folders, a ``LoadedModel``, an ``nn.Module`` or a state dict) and returns a
:class:`WeightComparison`, or two run files and returns a :class:`RunComparison`.
"""

from __future__ import annotations

from .api import compare, is_run_source
from .kernels import PairStats, pair_stats
from .names import Pairing, pair_names
from .result import MODULE_COLUMNS, STATUSES, TENSOR_COLUMNS, RunComparison, WeightComparison
from .runs import DEFAULT_TOLERANCE, compare_runs
from .schema import JSON_SCHEMA
from .sources import TensorSource, open_source
from .weights import compare_sides, compare_weights

__all__ = [
    "DEFAULT_TOLERANCE",
    "JSON_SCHEMA",
    "MODULE_COLUMNS",
    "STATUSES",
    "TENSOR_COLUMNS",
    "PairStats",
    "Pairing",
    "RunComparison",
    "TensorSource",
    "WeightComparison",
    "compare",
    "compare_runs",
    "compare_sides",
    "compare_weights",
    "is_run_source",
    "open_source",
    "pair_names",
    "pair_stats",
]
