"""The model's forward as captum sees it: inputs flattened, the output cut to the target."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from ..loading.models import LoadedModel, call_model, model_code, to_device
from ..utils.findings import InspectorError
from .state import preserved_state


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


def forward_advice(loaded: LoadedModel, other: str = "") -> str:
    """What to do when the model's forward raises: fix the file it comes from, or, for a Hugging
    Face folder (transformers' code, inputs built from its config), check the folder's config."""
    if str(getattr(loaded, "source", "")).startswith("hf:"):
        return (
            "the forward is transformers' code and the inputs come from config.json: check the folder's "
            "config (sizes, special token ids)"
            + (f", {other}" if other else "")
            + ", or pass inputs of your own"
        )
    return "fix the model's forward in its file" + (f", or {other}" if other else "")


def target_info(loaded: LoadedModel, inputs: Any = None) -> TargetInfo:
    """One forward pass (no gradients, eval mode, under the lock) to learn the output's shape.

    >>> from inspector.loading.models import load_model
    >>> target_info(load_model("sample:tiny-gpt2"))
    TargetInfo(outputs=32, positions=16)
    """
    loaded.check_runnable()
    inputs = loaded.example_inputs(1) if inputs is None else \
        to_device(inputs, loaded.input_device(), loaded.input_dtype())
    flat, _ = flatten_inputs(inputs)
    with loaded.lock, preserved_state(loaded.model, flat), torch.no_grad(), \
            model_code(f"the forward pass of {loaded.name}", forward_advice(loaded)):
        out = main_output(call_model(loaded.model, inputs), loaded.name)
    if out.dim() >= 3:
        return TargetInfo(int(out[:, -1].reshape(out.shape[0], -1).shape[1]), int(out.shape[1]))
    return TargetInfo(int(out.shape[1]) if out.dim() == 2 else 1, None)


def predicted_target(loaded: LoadedModel, inputs: Any, position: int = -1,
                     modules: list[nn.Module] | None = None) -> tuple[int, str] | None:
    """The model's own prediction as a target: the largest output of the first example (at
    ``position`` for ``(B, T, V)`` logits, the next token there), and what it is; None for a
    model with one output per sample or a position outside the sequence (the target check then
    says so). One forward pass, no gradients, eval mode, under the lock."""
    flat, _ = flatten_inputs(inputs)
    with loaded.lock, preserved_state(loaded.model, flat, modules=modules), torch.no_grad(), \
            model_code(f"the forward pass of {loaded.name}", forward_advice(loaded)):
        out = main_output(call_model(loaded.model, inputs), loaded.name)
    what = "class"
    if out.dim() >= 3:
        if not -out.size(1) <= position < out.size(1):
            return None
        out, what = out[:, position], f"token at position {position % out.size(1)}"
    out = out.reshape(out.size(0), -1) if out.dim() >= 2 else out.reshape(-1, 1)
    if out.size(1) < 2:
        return None
    return int(out[0].float().argmax()), what


class TargetedForward:
    """The model's forward reduced to what captum's target indexes, with the target checked.

    ``(B, T, V)`` logits are cut to ``[:, position]`` (captum recommends wrapping the forward
    rather than passing tuple targets); a wrong target raises before captum indexes it.
    """

    def __init__(self, model: nn.Module, rebuild: Callable[[tuple], Any], target: int | None,
                 position: int, name: str) -> None:
        self.model, self.rebuild, self.target, self.position, self.name = (
            model,
            rebuild,
            target,
            position,
            name,
        )
        self.used_position: int | None = None
        self.calls = 0
        self.on_call: Callable[[int], None] | None = None
        if target is not None and (isinstance(target, bool) or not isinstance(target, (int, np.integer))):
            raise InspectorError(f"target must be an integer index, got {target!r}")
        self.target = self.captum_target = None if target is None else int(target)

    def __call__(self, *xs: torch.Tensor) -> torch.Tensor:
        out = main_output(call_model(self.model, self.rebuild(xs)), self.name)
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


def main_output(out: Any, name: str) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    if isinstance(out, dict) and isinstance(out.get("logits"), torch.Tensor):
        return out["logits"]
    per_image = getattr(out, "logits_per_image", None)
    if isinstance(
        per_image, torch.Tensor
    ):  # a text-and-image model (CLIP): each image's score with its own text
        return per_image.diagonal()
    if getattr(out, "last_hidden_state", None) is not None:
        raise InspectorError(
            f"{name} returned {type(out).__name__}, hidden states without logits: it is a "
            "model without a head, so there is no output to attribute. Load a model with a "
            "head (a ...ForCausalLM, ...ForConditionalGeneration or ...ForSequenceClassification "
            "class), or use the captures view for its hidden states"
        )
    raise InspectorError(f"{name} returned {type(out).__name__}; attribution needs a tensor, "
                         "a tuple starting with one, or an output with .logits")


def flatten_inputs(inputs: Any) -> tuple[list[torch.Tensor], Callable[[tuple], Any]]:
    """Input tensors in order, and a function that rebuilds the model's call from them."""
    if isinstance(inputs, torch.Tensor):
        return [inputs], lambda xs: xs[0]
    if isinstance(inputs, dict):
        keys = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
        rest = {k: v for k, v in inputs.items() if k not in keys}
        return [inputs[k] for k in keys], lambda xs: {**rest, **dict(zip(keys, xs, strict=False))}
    if isinstance(inputs, (tuple, list)):
        if not all(isinstance(v, torch.Tensor) for v in inputs):
            raise InspectorError("attribution inputs must be tensors (a tensor, a tuple or a dict of them)")
        return list(inputs), lambda xs: tuple(xs)
    raise InspectorError(
        f"attribution inputs must be a tensor, a tuple or a dict, got {type(inputs).__name__}"
    )
