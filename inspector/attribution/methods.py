"""The captum methods an attribution can use, and the options each accepts."""

from __future__ import annotations

import difflib
import functools
import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..utils.findings import InspectorError
from ..utils.program import install_hint


def captum_attr() -> Any:
    """``captum.attr``, imported on first use (it takes seconds, and captum is an optional extra)."""
    try:
        import captum.attr
    except ImportError as exc:
        raise InspectorError(f"attributions need captum: {install_hint('attribution')}") from exc
    return captum.attr


@dataclass(frozen=True)
class MethodSpec:
    """One attribution method: the name of its captum class and what it needs."""

    name: str
    label: str
    captum_name: str
    on_layer: bool
    has_delta: bool
    interpolates_inputs: bool

    @property
    def captum_class(self) -> type:
        """The captum class (``captum.attr.<captum_name>``)."""
        return getattr(captum_attr(), self.captum_name)


METHODS: dict[str, MethodSpec] = {m.name: m for m in [
    MethodSpec("ig", "Integrated Gradients", "IntegratedGradients", False, True, True),
    MethodSpec("saliency", "Saliency", "Saliency", False, False, False),
    MethodSpec("input_x_gradient", "Input x Gradient", "InputXGradient", False, False, False),
    MethodSpec("layer_ig", "Layer Integrated Gradients", "LayerIntegratedGradients", True, True, False),
    MethodSpec("layer_conductance", "Layer Conductance", "LayerConductance", True, True, True),
    MethodSpec("layer_gradcam", "Layer GradCAM", "LayerGradCam", True, False, False),
]}


@functools.cache
def _option_names(captum_class: type[Any]) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(captum_class.attribute).parameters
                 if p not in ("self", "inputs", "target"))


def check_options(spec: MethodSpec, options: dict[str, Any]) -> dict[str, Any]:
    allowed = _option_names(spec.captum_class)
    options = dict(options)
    if "integration_method" in options and "method" in allowed:
        options["method"] = options.pop("integration_method")
    for key in options:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=2, cutoff=0.5)
            raise InspectorError(f"{spec.label} has no option {key!r}"
                                 + (f"; did you mean {', '.join(close)}?" if close else "")
                                 + f" Options: {', '.join(allowed)}"
                                 + (" (captum's 'method' is given as 'integration_method')"
                                    if "method" in allowed else ""))
    for key in ("n_steps", "internal_batch_size"):
        value = options.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer))
                                  or value < 1):
            raise InspectorError(f"{key} must be a whole number of at least 1, got {value!r}")
    return options
