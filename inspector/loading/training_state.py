"""A training checkpoint's parts: the model's state dict, the optimizer's, and extras (step, RNG,
scheduler), told apart by their top-level names as ``torch.distributed.checkpoint`` flattens
``{"model": ..., "optim": ..., "step": ...}`` (``model.h.0.weight``, ``optim.state.h.0.weight.exp_avg``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

MODEL_PARTS = ("state_dict", "model_state_dict", "model", "module")
"""The top-level names (keys) under which training checkpoints keep the model's state dict (``module``:
DeepSpeed), in the order a ``torch.save``'d dict holding more than one is read (the first that holds
tensors). :func:`training_parts` splits off at most one: with two holding tensors, there is none."""
OPTIMIZER_PARTS = ("optim", "optimizer", "optimizer_state_dict", "optim_state_dict", "opt", "optimizers")
EXTRA_PARTS = ("step", "steps", "epoch", "global_step", "iteration", "extra", "extras", "extra_state", "rng",
               "rng_state", "rng_states", "scheduler", "lr_scheduler", "schedulers", "dataloader", "sampler",
               "scaler", "grad_scaler", "trainer", "train_state", "metrics", "config", "args")


@dataclass(frozen=True)
class TrainingParts:
    """``model``: the top-level name of the model's part; ``optimizer`` and ``extras``: the other
    top-level names with how many entries each holds."""

    model: str
    optimizer: dict[str, int]
    extras: dict[str, int]

    def describe(self, label: str, tensors: int) -> str:
        """One sentence for a finding."""
        opt = ", ".join(f"{k} ({n} entries)" for k, n in self.optimizer.items()) or "none"
        extra = ", ".join(f"{k} ({n})" for k, n in self.extras.items()) or "none"
        return (f"{label} is a training checkpoint: its {self.model!r} part ({tensors} tensors) was compared "
                f"as the model; optimizer state: {opt}; extras: {extra} (their tensors are compared only "
                "with another training checkpoint's)")


def training_parts(names: Mapping[str, bool]) -> TrainingParts | None:
    """The parts of a flattened training checkpoint (``names``: entry name -> whether it is a tensor),
    or None when it is a plain state dict. A model part is split off only when every other top-level
    name is an optimizer's, a known extra (step, rng, scheduler...) or holds no tensor, so a model
    whose own names start with ``model.`` (Llama's ``model.layers...`` next to ``lm_head``) stays whole.

    >>> training_parts({"model.w": True, "optim.state.w.exp_avg": True, "step": False}).optimizer
    {'optim': 1}
    >>> training_parts({"model.layers.0.w": True, "lm_head.weight": True}) is None
    True
    """
    tops: dict[str, list[bool]] = {}
    for name, is_tensor in names.items():
        tops.setdefault(name.partition(".")[0] if "." in name else name, []).append(is_tensor)
    model = next((m for m in MODEL_PARTS if m in tops and any(tops[m])), None)
    if model is None or len(tops) < 2:
        return None
    optimizer, extras = {}, {}
    for top, kinds in tops.items():
        if top == model:
            continue
        if top in OPTIMIZER_PARTS:
            optimizer[top] = len(kinds)
        elif top in EXTRA_PARTS or not any(kinds):
            extras[top] = len(kinds)
        else:
            return None
    return TrainingParts(model, optimizer, extras)
