"""Compare two models, checkpoints or training runs: what changed, where, and what it means.

:func:`compare` takes two of anything the loader takes (``sample:``, ``FILE.py:factory``,
``hf:`` folders, ``.safetensors``/``.pt``/``.bin`` files, ``torch.distributed.checkpoint``
folders, a ``LoadedModel``, an ``nn.Module`` or a state dict) and returns a
:class:`WeightComparison`, or two run files and returns a :class:`RunComparison`.

Modules: ``api``: ``compare(a, b)``: two models or checkpoints, or two run files; ``findings``: the
findings of a weight comparison; ``kernels``: how far one tensor moved; ``names``: pairing the names of
two sides; ``opening``: ``open_source``, which side an argument is; ``result``: what a comparison
returns; ``sources``: the two sides of a comparison;
``weights``: ``compare_weights``; ``runs``: two training runs side by side (and
:func:`shown_step_columns`, the per-step columns a table shows); ``folder_sides``: sides
read from checkpoint folders; ``schema``: the JSON Schema of ``compare --json``; ``summary``: grouped
findings and the one-line summary of a weight comparison.
"""

from __future__ import annotations

from .api import compare, is_run_source
from .kernels import PairStats, pair_stats
from .names import Pairing, pair_names
from .opening import open_source
from .result import MODULE_COLUMNS, STATUSES, TENSOR_COLUMNS, RunComparison, WeightComparison
from .runs import DEFAULT_TOLERANCE, SHOWN_QUANTITIES, compare_runs, shown_step_columns
from .schema import JSON_SCHEMA
from .sources import TensorSource
from .weights import compare_sides, compare_weights

__all__ = [
    "DEFAULT_TOLERANCE",
    "JSON_SCHEMA",
    "MODULE_COLUMNS",
    "SHOWN_QUANTITIES",
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
    "shown_step_columns",
]
