"""Captum adapter: which inputs and which layers drove one output.

One function, :func:`attribute`, runs a fresh captum object under the model's lock
and returns an :class:`AttributionResult` (attribution tensors, a per-token or
per-unit summary, captum's convergence delta where the method has one, and
findings). The model and the inputs are left as they were found: training flags,
``requires_grad``, ``.grad`` and hooks, also when the forward pass or captum raises.

Targets: a model whose output is ``(B, C)`` is attributed at class ``target``; an
output ``(B, T, V)`` (a language model's logits) at ``[:, position, target]``, i.e. the
logit of next token ``target`` at ``position`` (the last one by default); an output
``(B,)`` takes no target.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd
import torch
from captum.attr import (
    InputXGradient,
    IntegratedGradients,
    LayerAttribution,
    LayerConductance,
    LayerGradCam,
    LayerIntegratedGradients,
    Saliency,
)
from torch import nn
from torch.utils.hooks import RemovableHandle

from .checks import require_loaded
from .findings import Finding, InspectorError
from .models import LoadedModel, call_model, model_code, to_device


@dataclass(frozen=True)
class MethodSpec:
    """One attribution method: its captum class and what it needs."""

    name: str
    label: str
    captum_class: type
    on_layer: bool
    has_delta: bool
    interpolates_inputs: bool


METHODS: dict[str, MethodSpec] = {m.name: m for m in [
    MethodSpec("ig", "Integrated Gradients", IntegratedGradients, False, True, True),
    MethodSpec("saliency", "Saliency", Saliency, False, False, False),
    MethodSpec("input_x_gradient", "Input x Gradient", InputXGradient, False, False, False),
    MethodSpec("layer_ig", "Layer Integrated Gradients", LayerIntegratedGradients, True, True, False),
    MethodSpec("layer_conductance", "Layer Conductance", LayerConductance, True, True, True),
    MethodSpec("layer_gradcam", "Layer GradCAM", LayerGradCam, True, False, False),
]}

_HOOK_DICTS = ("_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
               "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
               "_backward_pre_hooks")
DELTA_RELATIVE_TOLERANCE = 0.05
DELTA_ABSOLUTE_TOLERANCE = 1e-5


@dataclass(frozen=True)
class Completeness:
    """How far the attributions' sum is from ``F(input) - F(baseline)``, per sample.

    ``trusted`` is True when every ``|delta|`` is at most ``tolerance * |output_diff|``
    (or below ``1e-5`` where the output barely moves).
    """

    delta: tuple[float, ...]
    output_diff: tuple[float, ...]
    max_abs_delta: float
    max_relative: float
    tolerance: float
    trusted: bool


@dataclass(frozen=True)
class AttributionResult:
    """What :func:`attribute` found.

    Attributes:
        method: the method that ran (``"layer_ig"`` when ``"ig"`` was asked on token ids).
        requested: the method that was asked for.
        captum_method: the captum class used.
        target: the class or next-token index attributed (None for one-output models).
        position: the sequence position attributed for ``(B, T, V)`` outputs, else None.
        layer: the module name for layer methods, else None.
        attributions: detached CPU tensors, one per model input (or the layer output).
        inputs: detached CPU copies of the inputs (token ids or images, for figures).
        delta: captum's convergence delta per sample, where the method has one.
        token_model: the model takes integer token ids.
        findings: NaNs, a poor convergence delta, a method switch, the mode used.

    ``summary`` (built on first use) has one row per (tensor, sample, index along dim 1):
    columns ``tensor, sample, index, token, label, score, abs_score, nans``; ``score`` is NaN
    where any value it sums is NaN. For token models the index is the position.
    """

    method: str
    requested: str
    captum_method: str
    target: int | None
    position: int | None
    layer: str | None
    attributions: tuple[torch.Tensor, ...]
    inputs: tuple[torch.Tensor, ...]
    delta: torch.Tensor | None = None
    token_model: bool = False
    options: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    @cached_property
    def summary(self) -> pd.DataFrame:
        return _summary(self.attributions, self.inputs, self.token_model, self.layer)

    def completeness(self, tolerance: float = DELTA_RELATIVE_TOLERANCE) -> Completeness | None:
        """Completeness of IG-style methods (None for methods without a delta).

        ``output_diff`` is recovered as ``sum(attributions) - delta`` (captum's delta is
        ``sum(attributions) - (F(x) - F(baseline))``).
        """
        if self.delta is None:
            return None
        delta = self.delta.detach().double().reshape(-1)
        sums = sum(a.detach().double().reshape(a.shape[0], -1).sum(1) for a in self.attributions)
        diff = sums - delta
        rel = delta.abs() / diff.abs().clamp_min(1e-12)
        ok = bool(((delta.abs() <= tolerance * diff.abs()) | (delta.abs() <= DELTA_ABSOLUTE_TOLERANCE)).all())
        return Completeness(tuple(delta.tolist()), tuple(diff.tolist()), float(delta.abs().max()),
                            float(rel.max()), tolerance, ok and bool(torch.isfinite(delta).all()))

    def pixel_map(self, sample: int = 0) -> np.ndarray | None:
        """A (H, W) map at the input's resolution for image inputs, summed over channels.

        Layer maps (GradCAM, conductance of a conv layer) are upsampled bilinearly.
        None when the input or the attribution is not image-shaped.
        """
        if not self.inputs or self.inputs[0].dim() != 4 or self.attributions[0].dim() != 4:
            return None
        a = self.attributions[0][sample:sample + 1].sum(1, keepdim=True)  # (1, 1, h, w)
        size = tuple(self.inputs[0].shape[-2:])
        if tuple(a.shape[-2:]) != size:
            a = LayerAttribution.interpolate(a, size, "bilinear")
        return a[0, 0].numpy()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: NaN becomes None; tensors are described by shape, the summary kept."""
        comp = self.completeness()
        summary = self.summary.astype(object).where(self.summary.notna(), None)
        return {
            "method": self.method, "requested": self.requested, "captum_method": self.captum_method,
            "target": self.target, "position": self.position, "layer": self.layer,
            "token_model": self.token_model,
            "options": {k: _jsonable(v) for k, v in self.options.items()},
            "attribution_shapes": [list(a.shape) for a in self.attributions],
            "summary": summary.to_dict(orient="records"),
            "delta": None if self.delta is None else [_finite_or_none(v) for v in self.delta.tolist()],
            "completeness": None if comp is None else {
                "max_abs_delta": _finite_or_none(comp.max_abs_delta),
                "max_relative": _finite_or_none(comp.max_relative),
                "tolerance": comp.tolerance, "trusted": comp.trusted},
            "findings": [f.to_dict() for f in self.findings],
        }


def _new_result(**fields: Any) -> AttributionResult:
    """``AttributionResult(**fields)`` with every field given, filled in one step (a frozen
    dataclass's ``__init__`` sets its fields one ``object.__setattr__`` at a time)."""
    assert fields.keys() == _RESULT_FIELDS
    result = object.__new__(AttributionResult)
    result.__dict__.update(fields)
    return result


_RESULT_FIELDS = {f.name for f in dataclasses.fields(AttributionResult)}


def _finite_or_none(v: float) -> float | None:
    return v if math.isfinite(v) else None


def _jsonable(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        return f"tensor{list(v.shape)}"
    if isinstance(v, (tuple, list)):
        return [_jsonable(x) for x in v]
    return v if isinstance(v, (int, float, str, bool, type(None))) else repr(v)


# ---------------------------------------------------------------- what fits the model


def is_token_model(inputs: Any) -> bool:
    """True when the first input tensor holds integers (token ids)."""
    flat, _ = _flatten_inputs(inputs)
    return bool(flat) and not flat[0].is_floating_point() and not flat[0].is_complex()


def methods_for(loaded: LoadedModel, inputs: Any = None) -> list[str]:
    """The methods that fit ``loaded`` (with ``inputs`` or its example inputs).

    >>> from inspector.models import load_model
    >>> methods_for(load_model("sample:tiny-gpt2"))
    ['ig', 'layer_ig']
    """
    inputs = loaded.example_inputs(1) if inputs is None else inputs
    convs = conv_layers(loaded.model)
    if is_token_model(inputs):
        return ["ig", "layer_ig"] + (["layer_gradcam"] if convs else [])
    return ["ig", "saliency", "input_x_gradient", "layer_ig", "layer_conductance"] + \
        (["layer_gradcam"] if convs else [])


def layer_names(model: nn.Module) -> list[str]:
    """Every named submodule (the root excluded), in registration order."""
    return [n for n, _ in model.named_modules() if n]


_CONV = nn.modules.conv._ConvNd
_CPU = torch.device("cpu")


def conv_layers(model: nn.Module) -> list[str]:
    """Names of the convolution modules (``Conv1d/2d/3d`` and transposed)."""
    return [n for n, m in model.named_modules() if isinstance(m, _CONV)]


def embedding_layer(model: nn.Module) -> str | None:
    """The input-embedding module's name: ``get_input_embeddings()`` if the model has it,
    else the first ``nn.Embedding``."""
    names = {id(m): n for n, m in model.named_modules()}
    encoder = getattr(model, "get_encoder", None)
    if callable(encoder) and getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        try:  # an encoder-decoder embeds its input ids in the encoder (its shared table is not called)
            model = encoder() or model
        except (NotImplementedError, AttributeError):
            pass
    getter = getattr(model, "get_input_embeddings", None)
    if callable(getter):
        try:
            emb = getter()
        except (NotImplementedError, AttributeError):
            emb = None
        if emb is not None and id(emb) in names:
            return names[id(emb)]
    for n, m in model.named_modules():
        if isinstance(m, nn.Embedding):
            return n
    return None


def default_layer(loaded: LoadedModel, method: str, inputs: Any = None) -> str | None:
    """The layer a layer method uses when none is given (None: the user must choose)."""
    if method == "layer_gradcam":
        convs = conv_layers(loaded.model)
        return convs[-1] if convs else None
    if method == "layer_ig":
        inputs = loaded.example_inputs(1) if inputs is None else inputs
        return embedding_layer(loaded.model) if is_token_model(inputs) else safe_layer(loaded.model)
    return None


def safe_layer(model: nn.Module) -> str | None:
    """A layer whose output no later module overwrites in place: the last such convolution,
    else the first such leaf module (None for a model without submodules).

    Layer methods swap a layer's output for their own tensor; an ``inplace=True`` module
    right after it (``ReLU(inplace=True)`` after a convolution) then fails in autograd.

    >>> from sample_models import get_sample
    >>> safe_layer(get_sample("cnn-bn").build())  # conv1 is followed by ReLU(inplace=True)
    'conv2'
    """
    leaves = [(n, m) for n, m in model.named_modules() if n and not any(True for _ in m.children())]
    fine = [n for i, (n, _) in enumerate(leaves)
            if i + 1 >= len(leaves) or not getattr(leaves[i + 1][1], "inplace", False)]
    convs = [n for n in conv_layers(model) if n in fine]
    return convs[-1] if convs else fine[0] if fine else None


def resolve_layer(model: nn.Module, name: str, model_name: str = "model") -> nn.Module:
    """The submodule called ``name``; an unknown name gets an error with close names."""
    modules = dict(model.named_modules())
    if name and name in modules:
        return modules[name]
    names = layer_names(model)
    close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}?" if close else \
        f"its layers include {', '.join(names[:12])}{' ...' if len(names) > 12 else ''}"
    raise InspectorError(f"{model_name} has no layer named {name!r}; {hint}")


@dataclass(frozen=True)
class TargetInfo:
    """What a target can be: ``outputs`` entries per sample (1: no target), and for
    ``(B, T, V)`` outputs the sequence length ``positions``."""

    outputs: int
    positions: int | None

    @property
    def kind(self) -> str:
        return "next-token id" if self.positions is not None else \
            "class index" if self.outputs > 1 else "none"


def target_info(loaded: LoadedModel, inputs: Any = None) -> TargetInfo:
    """One forward pass (no gradients, eval mode, under the lock) to learn the output's shape.

    >>> from inspector.models import load_model
    >>> target_info(load_model("sample:tiny-gpt2"))
    TargetInfo(outputs=32, positions=16)
    """
    loaded.check_runnable()
    inputs = loaded.example_inputs(1) if inputs is None else \
        to_device(inputs, loaded.input_device(), loaded.input_dtype())
    flat, _ = _flatten_inputs(inputs)
    with loaded.lock, preserved_state(loaded.model, flat), torch.no_grad(), \
            model_code(f"the forward pass of {loaded.name}", "fix its forward in the model file"):
        out = _main_output(call_model(loaded.model, inputs), loaded.name)
    if out.dim() >= 3:
        return TargetInfo(int(out[:, -1].reshape(out.shape[0], -1).shape[1]), int(out.shape[1]))
    return TargetInfo(int(out.shape[1]) if out.dim() == 2 else 1, None)


# ---------------------------------------------------------------- the adapter


def attribute(loaded: LoadedModel, inputs: Any, method: str, target: int | None,
              layer: str | None = None, *, position: int = -1,
              progress: Callable[[int, int], None] | None = None, **options: Any) -> AttributionResult:
    """Attribute one output of ``loaded`` to its inputs or to a layer, with captum.

    Args:
        loaded: the model (``load_model``); its lock is held while captum runs.
        inputs: a tensor, a tuple or a dict of tensors; None for ``loaded.example_inputs(1)``.
        method: ``"ig"``, ``"saliency"``, ``"input_x_gradient"``, ``"layer_ig"``,
            ``"layer_conductance"`` or ``"layer_gradcam"``. ``"ig"`` on token ids runs as
            ``"layer_ig"`` on the input embedding (ids have no gradient); a finding says so.
        target: class index for ``(B, C)`` outputs, next-token id for ``(B, T, V)`` outputs,
            None for ``(B,)`` outputs.
        layer: module name for layer methods (default: the input embedding for
            ``layer_ig`` on token models, the last convolution for ``layer_gradcam``).
        position: sequence position attributed for ``(B, T, V)`` outputs (default: last).
        progress: called as ``progress(done, expected)`` after each forward pass captum makes.
            With it, integrating methods run their steps in about ten chunks (captum's
            ``internal_batch_size``, unless given), so ``done`` moves while they run.
        **options: passed to captum's ``attribute`` (``n_steps``, ``baselines``,
            ``internal_batch_size``...); captum's own ``method`` (the integration rule,
            e.g. ``"riemann_middle"``) is given as ``integration_method``. Methods with a
            delta return it unless ``return_convergence_delta=False``. On token models the
            first tensor (the ids) is attributed; further ones (an attention mask) are passed
            through as captum's ``additional_forward_args``.

    Raises:
        InspectorError: unknown method or layer, a method that does not fit the model,
            a target or position out of range, unknown options, a meta model.

    >>> from inspector.models import load_model
    >>> r = attribute(load_model("sample:cnn-bn"), None, "saliency", target=3)
    >>> r.attributions[0].shape, len(r.summary)
    (torch.Size([1, 3, 16, 16]), 3)
    """
    require_loaded(loaded, "attribute")
    if method not in METHODS:
        close = difflib.get_close_matches(str(method), list(METHODS), n=3, cutoff=0.4)
        raise InspectorError(f"unknown attribution method {method!r}"
                             + (f"; did you mean {', '.join(close)}?" if close else "")
                             + f" Methods: {', '.join(METHODS)}")
    model = loaded.model
    modules = _modules(model)  # one walk, reused for the device, the layer check and the state
    first = _first_tensor(modules)
    device = _CPU if first is None else first.device
    if first is not None and first.is_meta:
        loaded.check_runnable()  # raises with the first meta tensor's name
    inputs = loaded.example_inputs(1) if inputs is None else to_device(inputs, device, loaded.input_dtype())
    flat, rebuild = _flatten_inputs(inputs)
    if not flat:
        raise InspectorError(f"{loaded.name}: attribution needs at least one input tensor")
    tokens = not flat[0].is_floating_point() and not flat[0].is_complex()
    findings: list[Finding] = []
    requested = method
    if tokens and not METHODS[method].on_layer:
        if method != "ig":
            emb = embedding_layer(model)
            raise InspectorError(
                f"{loaded.name} takes integer token ids, which have no gradient, so {method!r} cannot "
                f"run on its inputs. Use 'layer_ig' on the input embedding"
                + (f" ({emb})" if emb else "") + " or 'ig' (which runs as layer_ig there).")
        method = "layer_ig"
        findings.append(Finding("method-switched", "info", "",
                                "the inputs are token ids (integers), so Integrated Gradients ran on "
                                "the input embedding's output (LayerIntegratedGradients)"))
    spec = METHODS[method]
    if tokens and spec.interpolates_inputs:
        raise InspectorError(
            f"{spec.label} interpolates between the inputs and a baseline, but {loaded.name} takes "
            "integer token ids, which cannot be interpolated. Use 'layer_ig' on a layer instead.")
    given = _submodule(model, layer) if spec.on_layer and layer else None
    if spec.name == "layer_gradcam" and not isinstance(given, _CONV) and \
            not any(isinstance(m, _CONV) for m in modules):
        raise InspectorError(
            f"GradCAM weighs a convolution's feature maps, and {loaded.name} has no convolution "
            "layer. Use 'layer_conductance' or 'layer_ig' for its layers, or 'ig' for its inputs.")
    layer_module = None
    if spec.on_layer:
        layer = layer or default_layer(loaded, spec.name, inputs)
        if not layer:
            names = layer_names(model)
            raise InspectorError(f"{spec.label} needs a layer: choose one of {loaded.name}'s modules, "
                                 f"e.g. {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")
        layer_module = given if given is not None else _submodule(model, layer)
        if layer_module is None:
            layer_module = resolve_layer(model, layer, loaded.name)  # raises with close names
    else:
        layer = None
        bad = [i for i, t in enumerate(flat) if not t.is_floating_point()]
        if bad:
            raise InspectorError(f"{spec.label} needs floating-point inputs; input {bad[0]} of "
                                 f"{loaded.name} is {flat[bad[0]].dtype}. Use a layer method.")
    options = _check_options(spec, options)
    if spec.has_delta:
        options.setdefault("return_convergence_delta", True)
    forward = _TargetedForward(model, rebuild, target, position, loaded.name)
    expected = 1
    if progress is not None:
        rows = int(flat[0].shape[0]) if flat[0].dim() else 1
        if spec.has_delta:
            steps = int(options.get("n_steps", 50))
            options.setdefault("internal_batch_size", rows * max(1, math.ceil(steps / 10)))
            per_call = max(1, int(options["internal_batch_size"]) // max(rows, 1))
            chunks = math.ceil(steps / per_call)
            # captum's extra passes: outputs at the inputs and baselines (for the delta); conductance
            # also runs every chunk twice
            expected = 2 * chunks + 2 if spec.name == "layer_conductance" else chunks + 4
        forward.on_call = lambda n: progress(min(n, expected), expected)
    with loaded.lock, preserved_state(model, flat, findings, modules=modules, enable_grad=True):
        def run(*xs: torch.Tensor) -> torch.Tensor:  # a plain function: captum inspects its signature
            return forward(*xs)

        algo = spec.captum_class(run) if layer_module is None else spec.captum_class(run, layer_module)
        arg = flat[0] if len(flat) == 1 else tuple(flat)
        if tokens and len(flat) > 1 and "additional_forward_args" not in options:
            # token ids are the input; the rest (an attention mask...) passes through unchanged
            arg, options = flat[0], {**options, "additional_forward_args": tuple(flat[1:])}
        if layer_module is None:  # captum would set it itself, with a warning; restored below either way
            for t in flat:
                if t.is_leaf and not t.requires_grad:
                    t.requires_grad_(True)
        with model_code(f"{spec.label} on {loaded.name}",
                        "fix the model's forward in its file, or choose another method or layer"):
            try:
                out = algo.attribute(arg, target=forward.captum_target, **options)
            except RuntimeError as exc:
                if layer is None or "in-place" not in str(exc) or isinstance(exc, InspectorError):
                    raise
                inplace = [n for n, m in model.named_modules() if getattr(m, "inplace", False) is True]
                raise InspectorError(
                    f"{spec.label} replaces the output of {layer} with its own tensor, and a later module "
                    f"changes that output in place ({', '.join(inplace) or 'an in-place operation'}), which "
                    "autograd refuses. Choose the in-place module itself (its output is the final value) "
                    "or another layer.") from exc
    delta = None
    if spec.has_delta and options.get("return_convergence_delta"):
        out, delta = out
        delta = _to_cpu(delta)
    attributions = (_to_cpu(out),) if isinstance(out, torch.Tensor) else tuple(_to_cpu(a) for a in out)
    if spec.name == "layer_gradcam" and attributions[0].dim() < 3:
        raise InspectorError(
            f"GradCAM needs a layer with spatial output (B, C, H, W); {layer} has none (its map has "
            f"shape {tuple(attributions[0].shape)}). Convolution layers: {', '.join(conv_layers(model))}")
    kept_inputs = tuple(_to_cpu(t) for t in flat)
    findings += _nan_findings(attributions, layer)
    result = _new_result(method=method, requested=requested, captum_method=spec.captum_class.__name__,
                         target=target, position=forward.used_position, layer=layer,
                         attributions=attributions, inputs=kept_inputs, delta=delta, token_model=tokens,
                         options=dict(options), findings=findings)
    comp = result.completeness()
    if comp is not None and not comp.trusted:
        findings.append(Finding(
            "completeness-poor", "warning", layer or "",
            f"convergence delta up to {comp.max_abs_delta:.3g} is {comp.max_relative:.1%} of the output "
            f"difference; raise n_steps (now {options.get('n_steps', 50)}) before trusting the scores"))
    return result


class _TargetedForward:
    """The model's forward reduced to what captum's target indexes, with the target checked.

    ``(B, T, V)`` logits are cut to ``[:, position]`` (captum recommends wrapping the forward
    rather than passing tuple targets); a wrong target raises before captum indexes it.
    """

    def __init__(self, model: nn.Module, rebuild: Callable[[tuple], Any], target: int | None,
                 position: int, name: str) -> None:
        self.model, self.rebuild, self.target, self.position, self.name = model, rebuild, target, position, name
        self.used_position: int | None = None
        self.calls = 0
        self.on_call: Callable[[int], None] | None = None
        if target is not None and (isinstance(target, bool) or not isinstance(target, (int, np.integer))):
            raise InspectorError(f"target must be an integer index, got {target!r}")
        self.target = self.captum_target = None if target is None else int(target)

    def __call__(self, *xs: torch.Tensor) -> torch.Tensor:
        out = _main_output(call_model(self.model, self.rebuild(xs)), self.name)
        self.calls += 1
        if self.on_call is not None:
            self.on_call(self.calls)
        if out.dim() >= 3:
            T = out.size(1)
            if not -T <= self.position < T:
                raise InspectorError(f"position {self.position} is outside the sequence of {self.name} "
                                     f"(length {T}); choose 0..{T - 1} or -1 for the last")
            self.used_position = self.position % T
            out = out[:, self.position]
            if out.dim() > 2:
                out = out.flatten(1)
        if out.dim() == 1:
            out = out.unsqueeze(1)
        if out.size(1) == 1:
            if self.target not in (None, 0):
                raise InspectorError(f"{self.name} gives one output per sample, so there is no target "
                                     f"{self.target} to choose; leave the target empty")
            return out
        n = out.size(1)
        what = "next-token id" if self.used_position is not None else "class index"
        if self.target is None:
            raise InspectorError(f"{self.name} gives {n} outputs per sample: choose a target "
                                 f"{what} in 0..{n - 1}")
        if not 0 <= self.target < n:
            raise InspectorError(f"target {self.target} is out of range for {self.name}: its output has "
                                 f"{n} entries, so the {what} must be in 0..{n - 1}")
        return out


def _main_output(out: Any, name: str) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    if isinstance(out, dict) and isinstance(out.get("logits"), torch.Tensor):
        return out["logits"]
    if getattr(out, "last_hidden_state", None) is not None:
        raise InspectorError(f"{name} returned {type(out).__name__}, hidden states without logits: it is a "
                             "model without a head, so there is no output to attribute. Load a model with a "
                             "head (a ...ForCausalLM, ...ForConditionalGeneration or ...ForSequenceClassification "
                             "class), or use the captures view for its hidden states")
    raise InspectorError(f"{name} returned {type(out).__name__}; attribution needs a tensor, "
                         "a tuple starting with one, or an output with .logits")


def _flatten_inputs(inputs: Any) -> tuple[list[torch.Tensor], Callable[[tuple], Any]]:
    """Input tensors in order, and a function that rebuilds the model's call from them."""
    if isinstance(inputs, torch.Tensor):
        return [inputs], lambda xs: xs[0]
    if isinstance(inputs, dict):
        keys = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
        rest = {k: v for k, v in inputs.items() if k not in keys}
        return [inputs[k] for k in keys], lambda xs: {**rest, **dict(zip(keys, xs))}
    if isinstance(inputs, (tuple, list)):
        if not all(isinstance(v, torch.Tensor) for v in inputs):
            raise InspectorError("attribution inputs must be tensors (a tensor, a tuple or a dict of them)")
        return list(inputs), lambda xs: tuple(xs)
    raise InspectorError(f"attribution inputs must be a tensor, a tuple or a dict, got {type(inputs).__name__}")


@functools.cache
def _option_names(captum_class: type) -> tuple[str, ...]:
    return tuple(p for p in inspect.signature(captum_class.attribute).parameters
                 if p not in ("self", "inputs", "target"))


def _check_options(spec: MethodSpec, options: dict[str, Any]) -> dict[str, Any]:
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


class preserved_state:  # noqa: N801 - used as a context manager, like contextlib's
    """Run in eval mode; afterwards restore every module's training flag, the tensors'
    ``requires_grad``, the parameters' ``.grad`` and remove any hook added meanwhile.

    Eval mode keeps BatchNorm's running statistics unchanged and dropout off. Hooks added
    meanwhile are found by their handle id: ids only grow, so a hook whose id is at least
    the next id at entry is new (nothing is scanned when no hook was registered at all).
    ``modules`` may pass ``list(model.modules())`` when the caller has walked it already;
    ``enable_grad`` also turns gradient computation on inside (as ``torch.enable_grad()``).

    >>> lin = nn.Linear(2, 1).train()
    >>> with preserved_state(lin, []):
    ...     _ = lin.register_forward_hook(lambda *a: None)
    ...     lin.training
    False
    >>> lin.training, len(lin._forward_hooks)
    (True, 0)
    """

    __slots__ = ("model", "tensors", "findings", "modules", "enable_grad", "modes", "grads", "flags",
                 "hook_id", "grad_switched")

    def __init__(self, model: nn.Module, tensors: list[torch.Tensor],
                 findings: list[Finding] | None = None, *, modules: list[nn.Module] | None = None,
                 enable_grad: bool = False) -> None:
        self.model, self.tensors, self.findings = model, tensors, findings
        self.modules = _modules(model) if modules is None else modules
        self.enable_grad = enable_grad

    def __enter__(self) -> None:
        modules = self.modules
        self.modes = modes = [m.training for m in modules]
        self.grads = [(p, p.grad) for m in modules for p in m._parameters.values() if p is not None]
        self.flags = [(t, t.requires_grad) for t in self.tensors]
        self.hook_id = RemovableHandle.next_id
        if self.model.training and self.findings is not None:
            self.findings.append(Finding("eval-mode", "info", "",
                                         "the model was in training mode; attribution ran in eval mode "
                                         "(BatchNorm statistics frozen, dropout off) and training mode "
                                         "was restored"))
        if any(modes):
            self.model.eval()
        self.grad_switched = self.enable_grad and not torch.is_grad_enabled()
        if self.grad_switched:
            torch.set_grad_enabled(True)

    def __exit__(self, *exc: object) -> None:
        if self.grad_switched:
            torch.set_grad_enabled(False)
        modules, modes = self.modules, self.modes
        if [m.training for m in modules] != modes:
            for m, mode in zip(modules, modes):
                if m.training != mode:
                    object.__setattr__(m, "training", mode)  # what Module.__setattr__ does for a bool
        removed = 0
        start = self.hook_id
        if RemovableHandle.next_id != start:  # some hook was registered meanwhile
            for m in modules:
                for d in map(m.__dict__.get, _HOOK_DICTS):
                    # hooks are added at either end of their dict (appended, or prepended), so a
                    # dict holds a new one only if its first or its last key is new
                    if d and (_is_new(next(iter(d)), start) or _is_new(next(reversed(d)), start)):
                        new = [k for k in d if _is_new(k, start)]
                        for k in new:
                            del d[k]
                        removed += len(new)
        for p, g in self.grads:
            if p.grad is not g:
                p.grad = g
        for t, flag in self.flags:
            if t.requires_grad != flag and t.is_leaf:
                t.requires_grad_(flag)
        if removed and self.findings is not None:
            self.findings.append(Finding("hook-removed", "warning", "",
                                         f"{removed} hook(s) left behind by captum were removed"))


def _is_new(key: Any, start: int) -> bool:
    return isinstance(key, int) and key >= start


def _modules(model: nn.Module) -> list[nn.Module]:
    """``list(model.modules())``: same order, each module once (an explicit stack instead of
    nested generators, which cost more on every call)."""
    out: list[nn.Module] = []
    seen: set[int] = set()
    stack = [model]
    while stack:
        m = stack.pop()
        if m is None or id(m) in seen:
            continue
        seen.add(id(m))
        out.append(m)
        children = m._modules
        if children:
            stack.extend(reversed(children.values()))
    return out


def _first_tensor(modules: list[nn.Module]) -> torch.Tensor | None:
    """The first parameter (else buffer) in module order: the tensor whose device
    ``LoadedModel.input_device`` reports."""
    for attr in ("_parameters", "_buffers"):
        for m in modules:
            for t in (m.__dict__.get(attr) or {}).values():
                if t is not None:
                    return t
    return None


def _submodule(model: nn.Module, name: str) -> nn.Module | None:
    """The registered submodule at dotted path ``name`` (None if there is none), without a walk."""
    m: nn.Module | None = model
    for part in name.split("."):
        children = getattr(m, "_modules", None)
        m = children.get(part) if isinstance(children, dict) else None
        if m is None:
            return None
    return m


def _to_cpu(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return t if t.is_cpu else t.to("cpu")


def _summary(attributions: tuple[torch.Tensor, ...], inputs: tuple[torch.Tensor, ...],
             tokens: bool, layer: str | None) -> pd.DataFrame:
    frames = []
    ids = inputs[0] if tokens else None
    for i, a in enumerate(attributions):
        name = layer or (f"input {i}" if len(attributions) > 1 else "input")
        B = a.shape[0]
        a3 = a.reshape(B, a.shape[1] if a.dim() > 1 else 1, -1).double()  # (B, D1, rest)
        D = a3.shape[1]
        score = a3.sum(-1).numpy()
        abs_score = a3.abs().sum(-1).numpy()
        nans = torch.isnan(a3).sum(-1).numpy()
        sample = np.repeat(np.arange(B), D)
        index = np.tile(np.arange(D), B)
        per_token = ids is not None and ids.dim() >= 2 and tuple(ids.shape[:2]) == (B, D)
        if per_token:
            tok = ids[:, :D].reshape(-1).numpy().astype(np.int64)
            token = pd.array(tok, dtype="Int64")
            label = [f"{p}:{t}" for p, t in zip(index, tok)]
        else:
            token = pd.array([None] * (B * D), dtype="Int64")
            kind = "channel" if a.dim() >= 4 else "feature" if a.dim() == 2 else "unit"
            label = [f"{kind} {j}" for j in index] if a.dim() > 1 else ["output"] * (B * D)
        frames.append(pd.DataFrame({
            "tensor": name, "sample": sample, "index": index, "token": token, "label": label,
            "score": score.reshape(-1), "abs_score": abs_score.reshape(-1),
            "nans": nans.reshape(-1).astype(np.int64)}))
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def _nan_findings(attributions: tuple[torch.Tensor, ...], layer: str | None) -> list[Finding]:
    out = []
    for i, a in enumerate(attributions):
        if not a.is_floating_point() or math.isfinite(a.sum().item()):
            continue  # a finite sum means no NaN and no infinity (one reduction, no mask)
        n = int(torch.isnan(a).sum())
        inf = int(torch.isinf(a).sum())
        where = layer or (f"input {i}" if len(attributions) > 1 else "input")
        if n:
            out.append(Finding("attribution-nan", "error", where,
                               f"{n} of {a.numel()} attribution values are NaN; they are left blank "
                               "in the figures, not shown as zeros. Check the model's outputs and "
                               "weights for NaN, and the baseline"))
        if inf:
            out.append(Finding("attribution-inf", "error", where,
                               f"{inf} of {a.numel()} attribution values are infinite"))
    return out
