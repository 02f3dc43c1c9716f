"""Local Hugging Face model folders: the saved class, a check of every saved tensor, example inputs.

A folder written by ``save_pretrained`` names the class it was saved from in
``config.json`` (``architectures``). :func:`load_hf_folder` loads that class; only when the
folder names none that transformers knows does it fall back, in this order, to the first of
:data:`FALLBACK_AUTO_CLASSES` that has a class for the config. Then it compares every saved
tensor with the model (:func:`inspector.hf_saved.check_saved`, from the files' headers and
transformers' loading report; values are read only where they may differ): a saved tensor the
model has no place for, a model tensor no saved tensor filled (left at its random
initialisation), a shape or dtype that changed, or a value that differs become findings. When saved tensors were dropped *and*
model tensors were left at their initial values (or shapes changed), the model is not the
saved one: those findings are errors, and so is the class finding when the class is not the
one the folder names.

Example inputs come from the config (:func:`example_inputs_for`): token ids and an attention
mask for text models, decoder ids as well for encoder-decoders, pixel values for vision models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .findings import Finding, InspectorError, Severity
from .hf_limits import check_folder_files, check_model_size, saved_architectures
from .hf_saved import SavedCheck, check_saved

#: Auto-class mappings tried, in this order, when ``config.architectures`` names no class
#: transformers knows: a causal language-model head first (sequence-to-sequence first for an
#: encoder-decoder config), then sequence-to-sequence, masked LM, image classification,
#: sequence classification, and the bare model last.
FALLBACK_AUTO_CLASSES: tuple[str, ...] = (
    "MODEL_FOR_CAUSAL_LM_MAPPING", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING", "MODEL_FOR_MASKED_LM_MAPPING",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING", "MODEL_MAPPING",
)
SEQUENCE_LENGTH = 8


@dataclass(frozen=True)
class ClassChoice:
    """Which class loads a folder, and why.

    ``saved`` is the first name in ``config.architectures`` (None when it names none);
    ``chosen`` is the class used; ``is_saved`` says whether they are the same.
    """

    chosen: Any  # a transformers PreTrainedModel subclass
    saved: str | None
    reason: str

    @property
    def is_saved(self) -> bool:
        return self.saved is not None and self.chosen.__name__ == self.saved


def choose_class(config: Any) -> ClassChoice:
    """The class named in ``config.architectures``, else the first fallback that fits the config.

    Only classes of transformers itself are considered (no code from the folder).

    >>> from transformers import GPT2Config
    >>> cfg = GPT2Config(architectures=["GPT2LMHeadModel"])
    >>> choose_class(cfg).chosen.__name__
    'GPT2LMHeadModel'
    >>> choose_class(GPT2Config()).chosen.__name__  # none named: a language-model head first
    'GPT2LMHeadModel'
    """
    import transformers
    from transformers.models.auto import modeling_auto

    names = saved_architectures(config)
    for name in names:
        cls = getattr(transformers, name, None) if name.isidentifier() else None
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel) and \
                cls.config_class is not None and isinstance(config, cls.config_class):
            return ClassChoice(cls, names[0], f"config.architectures names {name}")
    order = list(FALLBACK_AUTO_CLASSES)
    if getattr(config, "is_encoder_decoder", False):
        order.insert(0, order.pop(1))
    for mapping_name in order:
        mapping = getattr(modeling_auto, mapping_name)
        try:
            cls = mapping[type(config)]
        except KeyError:
            continue
        why = (f"transformers has no class {names[0]!r} (config.architectures) for "
               f"{type(config).__name__}" if names else "config.architectures names no class")
        return ClassChoice(cls, names[0] if names else None, f"{why}; {mapping_name} gives {cls.__name__}")
    raise InspectorError(f"transformers has no model class for {type(config).__name__} "
                         f"(model_type {getattr(config, 'model_type', '?')!r})")


def load_hf_folder(path: Path, max_bytes: int | None = None) -> tuple[nn.Module, list[Finding]]:
    """Load the model saved in ``path`` (eval mode, on the CPU) and check it against the saved files.

    ``max_bytes``: the largest model built (estimated on the meta device first; see
    :func:`inspector.hf_limits.check_model_size`).

    Raises:
        InspectorError: the folder cannot be read, transformers has no class for it, or it is too large.
    """
    check_folder_files(path)
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        choice = choose_class(config)
        check_model_size(choice.chosen, config, path, max_bytes)
        model, loading = choice.chosen.from_pretrained(path, local_files_only=True, trust_remote_code=False,
                                                       output_loading_info=True)
    except InspectorError:
        raise
    except Exception as exc:
        raise InspectorError(f"loading the Hugging Face model in {path} failed: "
                             f"{type(exc).__name__}: {exc}") from exc
    model.eval()
    check = check_saved(model, path, loading)
    checked = check.findings()
    mismatch = mismatch_finding(check)
    if mismatch is not None:  # not the saved model: what would be warnings are errors
        checked = [mismatch, *(_as_error(f) if f.code in ("unexpected-tensor", "left-at-init") else f
                               for f in checked)]
    return model, [*class_findings(choice, matches=mismatch is None), *tie_findings(model), *checked]


def tie_findings(model: nn.Module) -> list[Finding]:
    """A warning when the config asks to tie the output embedding to the input embedding and the
    loaded model does not (transformers keeps both when the folder saved two different values)."""
    config = getattr(model, "config", None)
    if not getattr(config, "tie_word_embeddings", False):
        return []
    try:
        hf_model: Any = model  # a transformers PreTrainedModel
        inp, out = hf_model.get_input_embeddings(), hf_model.get_output_embeddings()
    except (AttributeError, NotImplementedError):
        return []
    w_in, w_out = getattr(inp, "weight", None), getattr(out, "weight", None)
    if not isinstance(w_in, torch.Tensor) or not isinstance(w_out, torch.Tensor) or w_in is w_out:
        return []
    names = {id(m): n for n, m in model.named_modules()}
    a, b = names.get(id(out), "the output embedding"), names.get(id(inp), "the input embedding")
    return [Finding("hf-tie-skipped", "warning", f"{a}.weight",
                    f"config.json says tie_word_embeddings, but {a}.weight and {b}.weight are two tensors: "
                    "the folder saved two different values, so transformers kept both. Set "
                    "tie_word_embeddings to false, or re-tie them (the aliases view shows the pair)")]


def mismatch_finding(check: SavedCheck) -> Finding | None:
    """An error when saved tensors were dropped *and* model tensors were left at their initial
    value (or a shape changed): the model is then not the one saved in the folder."""
    if check.is_saved_model:
        return None
    shapes = f", {len(check.shape)} changed shape" if check.shape else ""
    return Finding("hf-not-saved-model", "error", "",
                   f"this is not the model saved in {check.folder}: {len(check.unexpected)} saved tensors "
                   f"have no place in it and {len(check.left)} of its tensors hold random initial "
                   f"values{shapes}. Its outputs and every number derived from them are not the saved model's")


def class_findings(choice: ClassChoice, matches: bool = True) -> list[Finding]:
    """What class loaded the folder; an error when it is not the saved class and the tensors do
    not match, a warning when the class is another (or unknown) but every saved tensor loaded."""
    name = choice.chosen.__name__
    if choice.is_saved:
        return [Finding("hf-class", "info", "", f"loaded as {name}, the class the folder was saved from")]
    severity: Severity = "warning" if matches else "error"
    if choice.saved is None:
        return [Finding("hf-class-guessed", severity, "",
                        f"the folder does not say which class it was saved from ({choice.reason}); "
                        "add it to config.json 'architectures'")]
    tail = ("every saved tensor found its place, so it is likely the same model" if matches else
            "it is not the saved model")
    return [Finding("hf-class-differs", severity, "",
                    f"the folder was saved from {choice.saved}, but this model is a {name} ({choice.reason}); "
                    f"{tail}. Install a transformers version that has {choice.saved}, or fix "
                    "'architectures' in config.json")]


def _as_error(f: Finding) -> Finding:
    return Finding(f.code, "error", f.where, f.message) if f.severity == "warning" else f


# ---------------------------------------------------------------- inputs and loss from the config


def _sub_config(config: Any, *names: str) -> Any:
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None and not isinstance(sub, (int, float, str, bool)):
            return sub
    return config


def input_kind(model: nn.Module) -> str:
    """``"pixels"`` (vision), ``"seq2seq"`` (encoder-decoder text) or ``"tokens"``."""
    config = getattr(model, "config", None)
    if getattr(model, "main_input_name", "input_ids") == "pixel_values":
        return "pixels"
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq"
    return "tokens"


def example_inputs_for(model: nn.Module) -> Callable[[int], dict[str, torch.Tensor]] | None:
    """A function ``batch_size -> inputs`` built from ``model.config``; None when the config
    says too little (no vocabulary size, no image size)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    kind = input_kind(model)
    if kind == "pixels":
        vision = _sub_config(config, "vision_config")
        size, channels = getattr(vision, "image_size", None), getattr(vision, "num_channels", 3)
        if not size:
            return None
        h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]

        def pixels(batch_size: int) -> dict[str, torch.Tensor]:
            gen = torch.Generator().manual_seed(0)
            return {"pixel_values": torch.randn(batch_size, channels, h, w, generator=gen)}
        return pixels
    text = _sub_config(config, "text_config", "encoder")
    vocab = getattr(text, "vocab_size", None)
    if not isinstance(vocab, int) or vocab <= 0:
        return None
    decoder_vocab: int = getattr(_sub_config(config, "decoder"), "vocab_size", None) or vocab
    limit = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    length = min(SEQUENCE_LENGTH, limit) if isinstance(limit, int) and limit > 0 else SEQUENCE_LENGTH

    def tokens(batch_size: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (batch_size, length), generator=gen)
        inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        if kind == "seq2seq":
            inputs["decoder_input_ids"] = torch.randint(0, decoder_vocab, (batch_size, length), generator=gen)
        return inputs
    return tokens


def loss_for(model: nn.Module) -> Callable[[Any, Any], torch.Tensor] | None:
    """A loss on the model's logits: cross-entropy against class 0 for classifiers (sequence,
    token or image), next-token cross-entropy for causal LMs (on the decoder ids for
    encoder-decoders), per-token cross-entropy for masked LMs. None for a model without a head."""
    cls_name = type(model).__name__
    if cls_name.endswith("Classification"):
        def classify(outputs: Any, inputs: Any) -> torch.Tensor:
            logits = _logits(outputs)
            logits = logits.reshape(-1, logits.size(-1))
            return nn.functional.cross_entropy(logits, torch.zeros(len(logits), dtype=torch.long,
                                                                   device=logits.device))
        return classify
    out_emb = getattr(model, "get_output_embeddings", None)
    if input_kind(model) == "pixels" or not callable(out_emb) or out_emb() is None:
        return None
    masked = cls_name.endswith(("ForMaskedLM", "ForPreTraining"))

    def language(outputs: Any, inputs: Any) -> torch.Tensor:
        logits = _logits(outputs)
        ids = inputs.get("decoder_input_ids", inputs["input_ids"])
        if not masked:
            logits, ids = logits[:, :-1], ids[:, 1:]
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids.reshape(-1))
    return language


def _logits(outputs: Any) -> torch.Tensor:
    logits = getattr(outputs, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(outputs, dict) and isinstance(outputs.get("logits"), torch.Tensor):
        return outputs["logits"]
    return outputs[0]
