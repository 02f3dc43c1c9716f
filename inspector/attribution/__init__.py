"""Captum adapter: which inputs and which layers drove one output.

One function, :func:`attribute`, runs a fresh captum object under the model's lock and
returns an :class:`Attribution` (attribution tensors, a per-token or per-unit summary,
captum's convergence delta where the method has one, and findings). The model and the
inputs are left as they were found: training flags, ``requires_grad``, ``.grad`` and
hooks, also when the forward pass or captum raises.

Modules: ``methods``: the captum methods an attribution can use; ``result``: what an attribution found;
``state``: eval mode for the call; ``adapter``: captum adapter: which inputs and which layers drove one
output; ``forward``: the model's forward as captum sees it; ``layers``: which methods, layers and inputs
fit a model.
"""

from __future__ import annotations

from .adapter import attribute
from .forward import TargetInfo, target_info
from .layers import (
    conv_layers,
    default_layer,
    embedding_layer,
    is_token_model,
    layer_names,
    methods_for,
    resolve_layer,
    safe_layer,
)
from .methods import METHODS, MethodSpec
from .result import (
    DELTA_ABSOLUTE_TOLERANCE,
    DELTA_RELATIVE_TOLERANCE,
    Attribution,
    AttributionResult,
    Completeness,
)
from .state import preserved_state

__all__ = [
    "DELTA_ABSOLUTE_TOLERANCE",
    "DELTA_RELATIVE_TOLERANCE",
    "METHODS",
    "Attribution",
    "AttributionResult",
    "Completeness",
    "MethodSpec",
    "TargetInfo",
    "attribute",
    "conv_layers",
    "default_layer",
    "embedding_layer",
    "is_token_model",
    "layer_names",
    "methods_for",
    "preserved_state",
    "resolve_layer",
    "safe_layer",
    "target_info",
]
