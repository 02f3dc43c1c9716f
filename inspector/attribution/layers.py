"""Which methods, layers and inputs fit a model: names, defaults and checks."""

from __future__ import annotations

import difflib
from typing import Any

import torch
from torch import nn

from ..loading.models import LoadedModel
from ..utils.findings import InspectorError
from .forward import flatten_inputs


def is_token_model(inputs: Any) -> bool:
    """True when the first input tensor holds integers (token ids)."""
    flat, _ = flatten_inputs(inputs)
    return bool(flat) and not flat[0].is_floating_point() and not flat[0].is_complex()


def methods_for(loaded: LoadedModel, inputs: Any = None) -> list[str]:
    """The methods that fit ``loaded`` (with ``inputs`` or its example inputs).

    >>> from inspector.loading.models import load_model
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


CONV = nn.modules.conv._ConvNd


def conv_layers(model: nn.Module) -> list[str]:
    """Names of the convolution modules (``Conv1d/2d/3d`` and transposed)."""
    return [n for n, m in model.named_modules() if isinstance(m, CONV)]


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


def first_tensor(modules: list[nn.Module]) -> torch.Tensor | None:
    """The first parameter (else buffer) in module order: the tensor whose device
    ``LoadedModel.input_device`` reports."""
    for attr in ("_parameters", "_buffers"):
        for m in modules:
            for t in (m.__dict__.get(attr) or {}).values():
                if t is not None:
                    return t
    return None


def submodule(model: nn.Module, name: str) -> nn.Module | None:
    """The registered submodule at dotted path ``name`` (None if there is none), without a walk."""
    m: nn.Module | None = model
    for part in name.split("."):
        children = getattr(m, "module_list", None)
        m = children.get(part) if isinstance(children, dict) else None
        if m is None:
            return None
    return m
