"""Captum adapter: which inputs and which layers drove one output.

One function, :func:`attribute`, runs a fresh captum object under the model's lock
and returns an :class:`Attribution` (attribution tensors, a per-token or
per-unit summary, captum's convergence delta where the method has one, and
findings). The model and the inputs are left as they were found: training flags,
``requires_grad``, ``.grad`` and hooks, also when the forward pass or captum raises.

Targets: a model whose output is ``(B, C)`` is attributed at class ``target``; an
output ``(B, T, V)`` (a language model's logits) at ``[:, position, target]``, i.e. the
logit of next token ``target`` at ``position`` (the last one by default); an output
``(B,)`` takes no target.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..loading.models import LoadedModel, model_code, to_device
from ..utils.checks import require_loaded
from ..utils.findings import Finding, InspectorError
from .forward import TargetedForward, flatten_inputs, forward_advice, predicted_target
from .layers import (
    CONV,
    conv_layers,
    default_layer,
    embedding_layer,
    first_tensor,
    layer_names,
    resolve_layer,
    submodule,
)
from .methods import METHODS, MethodSpec, check_options
from .result import Attribution, new_result
from .state import module_list, preserved_state

_CPU = torch.device("cpu")


def attribute(loaded: LoadedModel, inputs: Any, method: str, target: int | None,
              layer: str | None = None, *, position: int = -1,
              progress: Callable[[int, int], None] | None = None, **options: Any) -> Attribution:
    """Attribute one output of ``loaded`` to its inputs or to a layer, with captum.

    Args:
        loaded: the model (``load_model``); its lock is held while captum runs.
        inputs: a tensor, a tuple or a dict of tensors; None for ``loaded.example_inputs(1)``.
        method: ``"ig"``, ``"saliency"``, ``"input_x_gradient"``, ``"layer_ig"``,
            ``"layer_conductance"`` or ``"layer_gradcam"``. ``"ig"`` on token ids runs as
            ``"layer_ig"`` on the input embedding (ids have no gradient); a finding says so.
        target: class index for ``(B, C)`` outputs, next-token id for ``(B, T, V)`` outputs;
            None for the model's own prediction (the first example's largest output: its
            predicted class, or its next token at ``position``; an ``attribution-target``
            finding says which) and for ``(B,)`` outputs.
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

    >>> from inspector.loading.models import load_model
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
    call = _prepare(loaded, inputs, method, target, layer, position, options)
    if progress is not None:
        _report_progress(call, progress)
    out = _run(loaded, call)
    return _result(call, out, call.forward.target)


@dataclass(slots=True)
class _Call:
    """One captum call, prepared and checked: the method, the layer, the inputs, the forward."""

    spec: MethodSpec
    requested: str
    layer: str | None
    layer_module: nn.Module | None
    flat: list[torch.Tensor]
    tokens: bool
    modules: list[nn.Module]
    forward: TargetedForward
    options: dict[str, Any]
    findings: list[Finding]
    attributed: int = 1  # the first ``attributed`` of ``flat`` are attributed; the rest pass through


def _prepare(loaded: LoadedModel, inputs: Any, method: str, target: int | None, layer: str | None,
             position: int, options: dict[str, Any]) -> _Call:
    """Inputs on the model's device, the method (switched for token ids), the layer, the options."""
    model = loaded.model
    modules = module_list(model)  # one walk, reused for the device, the layer check and the state
    first = first_tensor(modules)
    device = _CPU if first is None else first.device
    if first is not None and first.is_meta:
        loaded.check_runnable()  # raises with the first meta tensor's name
    inputs = loaded.example_inputs(1) if inputs is None else to_device(inputs, device, loaded.input_dtype())
    flat, rebuild = flatten_inputs(inputs)
    if not flat:
        raise InspectorError(f"{loaded.name}: attribution needs at least one input tensor")
    tokens = not flat[0].is_floating_point() and not flat[0].is_complex()
    flat, rebuild, attributed = _attributed_first(flat, rebuild, tokens)
    findings: list[Finding] = []
    spec = _method_for_inputs(loaded, method, tokens, findings)
    layer, layer_module = _layer(loaded, spec, layer, modules, inputs, flat)
    options = check_options(spec, options)
    if spec.has_delta:
        options.setdefault("return_convergence_delta", True)
    if target is None:
        target = _default_target(loaded, inputs, position, modules, findings)
    forward = TargetedForward(model, rebuild, target, position, loaded.name)
    return _Call(
        spec, method, layer, layer_module, flat, tokens, modules, forward, options, findings, attributed
    )


def _placeholder_token(model: nn.Module) -> int | None:
    """The token id a text-and-image model (Llava) replaces with image features, if any."""
    config = getattr(model, "config", None)
    for name in ("image_token_index", "image_token_id"):
        token = getattr(config, name, None)
        if isinstance(token, int) and not isinstance(token, bool):
            return token
    return None


def _attributed_first(flat: list[torch.Tensor], rebuild: Callable[[tuple], Any],
                      tokens: bool) -> tuple[list[torch.Tensor], Callable[[tuple], Any], int]:
    """The inputs in the order captum takes them: those attributed first (the token ids; else every
    floating-point input: features, pixels), then those passed through (masks, decoder ids, labels)."""
    if tokens:
        return flat, rebuild, 1
    order = [i for i, t in enumerate(flat) if t.is_floating_point()]
    order += [i for i in range(len(flat)) if i not in order]
    if order == list(range(len(flat))):
        return flat, rebuild, sum(t.is_floating_point() for t in flat) or len(flat)
    back = [order.index(i) for i in range(len(flat))]
    return ([flat[i] for i in order], lambda xs: rebuild(tuple(xs[j] for j in back)),
            sum(t.is_floating_point() for t in flat))


def _default_target(loaded: LoadedModel, inputs: Any, position: int, modules: list[nn.Module],
                    findings: list[Finding]) -> int | None:
    predicted = predicted_target(loaded, inputs, position, modules)
    if predicted is None:
        return None
    target, what = predicted
    findings.append(Finding("attribution-target", "info", "",
                            f"no target given: attributed the predicted {what}, {target} (the largest output "
                            "of the first example); give a target to attribute another"))
    return target


def _method_for_inputs(loaded: LoadedModel, method: str, tokens: bool, findings: list[Finding]) -> MethodSpec:
    """The method that runs: ``"ig"`` on token ids becomes ``"layer_ig"`` (with a finding)."""
    if tokens and not METHODS[method].on_layer:
        if method != "ig":
            emb = embedding_layer(loaded.model)
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
    return spec


def _layer(loaded: LoadedModel, spec: MethodSpec, layer: str | None, modules: list[nn.Module], inputs: Any,
           flat: list[torch.Tensor]) -> tuple[str | None, nn.Module | None]:
    """The layer's name and module for layer methods (its default if none is given); (None, None) else."""
    model = loaded.model
    given = submodule(model, layer) if spec.on_layer and layer else None
    if spec.name == "layer_gradcam" and not isinstance(given, CONV) and \
            not any(isinstance(m, CONV) for m in modules):
        raise InspectorError(
            f"GradCAM weighs a convolution's feature maps, and {loaded.name} has no convolution "
            "layer. Use 'layer_conductance' or 'layer_ig' for its layers, or 'ig' for its inputs.")
    if not spec.on_layer:
        bad = [i for i, t in enumerate(flat[:1]) if not t.is_floating_point()]  # the attributed come first
        if bad:
            raise InspectorError(f"{spec.label} needs floating-point inputs; input {bad[0]} of "
                                 f"{loaded.name} is {flat[bad[0]].dtype}. Use a layer method.")
        return None, None
    layer = layer or default_layer(loaded, spec.name, inputs)
    if not layer:
        names = layer_names(model)
        raise InspectorError(f"{spec.label} needs a layer: choose one of {loaded.name}'s modules, "
                             f"e.g. {', '.join(names[:8])}{' ...' if len(names) > 8 else ''}")
    layer_module = given if given is not None else submodule(model, layer)
    if layer_module is None:
        layer_module = resolve_layer(model, layer, loaded.name)  # raises with close names
    return layer, layer_module


def _report_progress(call: _Call, progress: Callable[[int, int], None]) -> None:
    """Call ``progress(done, expected)`` after each forward pass; integrating methods run in ~10 chunks."""
    spec, options, flat = call.spec, call.options, call.flat
    expected = 1
    if spec.has_delta:
        rows = int(flat[0].shape[0]) if flat[0].dim() else 1
        steps = int(options.get("n_steps", 50))
        # chunks of at most 32 steps: memory stays bounded however many steps are asked for
        options.setdefault("internal_batch_size", rows * max(1, min(math.ceil(steps / 10), 32)))
        per_call = max(1, int(options["internal_batch_size"]) // max(rows, 1))
        chunks = math.ceil(steps / per_call)
        # captum's extra passes: outputs at the inputs and baselines (for the delta); conductance
        # also runs every chunk twice
        expected = 2 * chunks + 2 if spec.name == "layer_conductance" else chunks + 4
    call.forward.on_call = lambda n: progress(min(n, expected), expected)


def _run(loaded: LoadedModel, call: _Call) -> Any:
    """captum's ``attribute`` under the model's lock, the model's state put back afterwards."""
    spec, flat, options, forward, layer = call.spec, call.flat, call.options, call.forward, call.layer
    model = loaded.model
    with loaded.lock, preserved_state(model, flat, call.findings, modules=call.modules, enable_grad=True):
        def run(*xs: torch.Tensor) -> torch.Tensor:  # a plain function: captum inspects its signature
            return forward(*xs)

        algo = (
            spec.captum_class(run) if call.layer_module is None else spec.captum_class(run, call.layer_module)
        )
        n = call.attributed
        arg = flat[0] if n == 1 else tuple(flat[:n])
        if call.tokens and "baselines" not in options and (keep := _placeholder_token(model)) is not None:
            # a baseline of token 0 everywhere but the image placeholders, which the model needs
            options = {
                **options,
                "baselines": torch.where(flat[0] == keep, flat[0], torch.zeros_like(flat[0])),
            }
        if len(flat) > n and "additional_forward_args" not in options:
            # token ids (or features, pixels) are the input; the rest (an attention mask, decoder
            # ids, labels) passes through unchanged
            options = {**options, "additional_forward_args": tuple(flat[n:])}
            call.options = options  # the result records them
        if call.layer_module is None:  # captum would set it itself, with a warning; restored below either way
            for t in flat[:n]:
                if t.is_leaf and not t.requires_grad:
                    t.requires_grad_(True)
        with model_code(f"{spec.label} on {loaded.name}",
                        forward_advice(loaded, "choose another method or layer")):
            try:
                return algo.attribute(arg, target=forward.captum_target, **options)
            except MemoryError as exc:
                raise _out_of_memory(spec.label, options) from exc
            except RuntimeError as exc:
                if _is_out_of_memory(exc):
                    raise _out_of_memory(spec.label, options) from exc
                if layer is None or "in-place" not in str(exc) or isinstance(exc, InspectorError):
                    raise
                inplace = [n for n, m in model.named_modules() if getattr(m, "inplace", False) is True]
                raise InspectorError(
                    f"{spec.label} replaces the output of {layer} with its own tensor, and a later module "
                    f"changes that output in place ({', '.join(inplace) or 'an in-place operation'}), which "
                    "autograd refuses. Choose the in-place module itself (its output is the final value) "
                    "or another layer.") from exc


def _result(call: _Call, out: Any, target: int | None) -> Attribution:
    """captum's output as an Attribution: CPU copies, NaN findings, the completeness check."""
    spec, layer, options, findings = call.spec, call.layer, call.options, call.findings
    delta = None
    if spec.has_delta and options.get("return_convergence_delta"):
        out, delta = out
        delta = _to_cpu(delta)
    attributions = (_to_cpu(out),) if isinstance(out, torch.Tensor) else tuple(_to_cpu(a) for a in out)
    if spec.name == "layer_gradcam" and attributions[0].dim() < 3:
        raise InspectorError(
            f"GradCAM needs a layer with spatial output (B, C, H, W); {layer} has none (its map has "
            f"shape {tuple(attributions[0].shape)}). Convolution layers: "
            f"{', '.join(conv_layers(call.forward.model))}"
        )
    findings += _nan_findings(attributions, layer)
    result = new_result(method=spec.name, requested=call.requested, captum_method=spec.captum_class.__name__,
                        target=target, position=call.forward.used_position, layer=layer,
                        attributions=attributions, inputs=tuple(_to_cpu(t) for t in call.flat), delta=delta,
                        token_model=call.tokens, options=dict(options), findings=findings)
    comp = result.completeness()
    if comp is not None and not comp.trusted:
        findings.append(Finding(
            "completeness-poor", "warning", layer or "",
            f"convergence delta up to {comp.max_abs_delta:.3g} is {comp.max_relative:.1%} of the output "
            f"difference; raise n_steps (now {options.get('n_steps', 50)}) before trusting the scores"))
    return result


def _to_cpu(t: torch.Tensor) -> torch.Tensor:
    t = t.detach()
    return t if t.is_cpu else t.to("cpu")


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


def _is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError) or any(
        text in str(exc) for text in ("can't allocate memory", "out of memory", "Out of memory"))


def _out_of_memory(label: str, options: dict[str, Any]) -> InspectorError:
    """Running out of memory is the size of the request, not a fault of the model's forward."""
    return InspectorError(
        f"{label} ran out of memory with n_steps={options.get('n_steps', 50)} and "
        f"internal_batch_size={options.get('internal_batch_size')}; lower n_steps "
        "(--steps), the batch size or internal_batch_size, or run on a device with more memory"
    )
