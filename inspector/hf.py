"""Local Hugging Face model folders: the saved class, a check of every saved tensor, example inputs.

A folder written by ``save_pretrained`` names the class it was saved from in
``config.json`` (``architectures``). :func:`load_hf_folder` loads that class; only when the
folder names none that transformers knows does it fall back, in this order, to the first of
:data:`FALLBACK_AUTO_CLASSES` that has a class for the config. Then it compares every saved
tensor with the model (:func:`compare_saved`): a saved tensor the model has no place for, a
model tensor no saved tensor filled (left at its random initialisation), a shape or dtype that
changed, or a value that differs become findings. When saved tensors were dropped *and*
model tensors were left at their initial values (or shapes changed), the model is not the
saved one: those findings are errors, and so is the class finding when the class is not the
one the folder names.

Example inputs come from the config (:func:`example_inputs_for`): token ids and an attention
mask for text models, decoder ids as well for encoder-decoders, pixel values for vision models.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .findings import Finding, InspectorError

#: Auto-class mappings tried, in this order, when ``config.architectures`` names no class
#: transformers knows: a causal language-model head first (sequence-to-sequence first for an
#: encoder-decoder config), then sequence-to-sequence, masked LM, image classification,
#: sequence classification, and the bare model last.
FALLBACK_AUTO_CLASSES: tuple[str, ...] = (
    "MODEL_FOR_CAUSAL_LM_MAPPING", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING", "MODEL_FOR_MASKED_LM_MAPPING",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING", "MODEL_MAPPING",
)
SEQUENCE_LENGTH = 8
#: Findings reported one by one; beyond this many of one kind they are summed up in one.
MAX_LISTED = 20


@dataclass(frozen=True)
class ClassChoice:
    """Which class loads a folder, and why.

    ``saved`` is the first name in ``config.architectures`` (None when it names none);
    ``chosen`` is the class used; ``is_saved`` says whether they are the same.
    """

    chosen: type
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

    names = [a for a in (getattr(config, "architectures", None) or []) if isinstance(a, str)]
    for name in names:
        cls = getattr(transformers, name, None) if name.isidentifier() else None
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel) and \
                isinstance(config, cls.config_class):
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


def load_hf_folder(path: Path) -> tuple[nn.Module, list[Finding]]:
    """Load the model saved in ``path`` (eval mode, on the CPU) and check it against the saved files.

    Raises:
        InspectorError: the folder cannot be read or transformers has no class for it.
    """
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        choice = choose_class(config)
        model = choice.chosen.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except InspectorError:
        raise
    except Exception as exc:
        raise InspectorError(f"loading the Hugging Face model in {path} failed: "
                             f"{type(exc).__name__}: {exc}") from exc
    model.eval()
    checked = compare_saved(model, path)
    mismatch = mismatch_finding(checked, path)
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
        inp, out = model.get_input_embeddings(), model.get_output_embeddings()
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


def mismatch_finding(findings: list[Finding], path: Path) -> Finding | None:
    """An error when saved tensors were dropped *and* model tensors were left at their initial
    value (or a shape changed): the model is then not the one saved in ``path``."""
    count = {code: sum(_tensors_in(f) for f in findings if f.code == code)
             for code in ("unexpected-tensor", "left-at-init", "shape-changed")}
    if not (count["unexpected-tensor"] and count["left-at-init"]) and not count["shape-changed"]:
        return None
    shapes = f", {count['shape-changed']} changed shape" if count["shape-changed"] else ""
    return Finding("hf-not-saved-model", "error", "",
                   f"this is not the model saved in {path.name}: {count['unexpected-tensor']} saved tensors "
                   f"have no place in it and {count['left-at-init']} of its tensors hold random initial "
                   f"values{shapes}. Its outputs and every number derived from them are not the saved model's")


def class_findings(choice: ClassChoice, matches: bool = True) -> list[Finding]:
    """What class loaded the folder; an error when it is not the saved class and the tensors do
    not match, a warning when the class is another (or unknown) but every saved tensor loaded."""
    name = choice.chosen.__name__
    if choice.is_saved:
        return [Finding("hf-class", "info", "", f"loaded as {name}, the class the folder was saved from")]
    severity = "warning" if matches else "error"
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


# ---------------------------------------------------------------- saved tensors vs the model


WEIGHT_FILES = (("model.safetensors.index.json", "model.safetensors"),
                ("pytorch_model.bin.index.json", "pytorch_model.bin"))


def saved_files(path: Path) -> list[Path]:
    """The weight files of a folder: ``model.safetensors`` (or the shards its index lists), else
    ``pytorch_model.bin`` (or its shards), as transformers looks for them."""
    for index_name, single in WEIGHT_FILES:
        index = path / index_name
        if index.is_file():
            try:
                shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise InspectorError(f"{index} is not a readable shard index "
                                     f"({type(exc).__name__}: {exc})") from exc
            return [path / s for s in shards if isinstance(s, str) and Path(s).name == s]
        if (path / single).is_file():
            return [path / single]
    return []


def _saved_tensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """One tensor (safetensors) or one file (torch, read with ``weights_only=True``) at a time,
    so a large folder is never held in memory twice."""
    from safetensors import safe_open

    from .models import read_checkpoint

    for file in files:
        if file.suffix != ".safetensors":
            yield from read_checkpoint(file)[0].items()
            continue
        with safe_open(str(file), framework="pt") as fh:
            for key in fh.keys():
                yield key, fh.get_tensor(key)


def saved_form(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` under the names ``save_pretrained`` writes: transformers renames some tensors
    on loading (and may merge some), and writes the original names back on saving."""
    try:
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # a transformers without weight conversions saves the names it loads
        return dict(state)
    try:
        with torch.no_grad():
            return dict(revert_weight_conversion(model, dict(state)))
    except Exception:  # noqa: BLE001 - a conversion that cannot run backwards: compare by name
        return dict(state)


def _candidates(key: str, prefix: str) -> list[str]:
    """Names a saved key may have in the model: itself, with or without the base-model prefix."""
    out = [key]
    if prefix:
        out += [key[len(prefix) + 1:]] if key.startswith(prefix + ".") else [f"{prefix}.{key}"]
    return out


def compare_saved(model: nn.Module, path: Path) -> list[Finding]:
    """Compare every saved tensor of ``path`` with ``model``'s state dict; findings for each difference.

    A model tensor not saved under its own name counts as filled when a tensor it is tied to
    (the same object) was saved.
    """
    files = saved_files(path)
    if not files:
        return [Finding("hf-not-checked", "info", path.name,
                        f"{path.name} holds no model.safetensors or pytorch_model.bin; its tensors were not "
                        "compared with the model")]
    own = model.state_dict(keep_vars=True)
    names_of: dict[int, list[str]] = {}
    for key, t in own.items():
        names_of.setdefault(id(t), []).append(key)
    expected = saved_form(model, own)
    prefix = getattr(model, "base_model_prefix", "") or ""
    filled: set[int] = set()
    filled_keys: set[str] = set()
    unexpected, shape, dtype, differ = [], [], [], []
    for key, saved in _saved_tensors(files):
        name = next((c for c in _candidates(key, prefix) if c in expected), None)
        if name is None:
            unexpected.append(key)
            continue
        t = expected[name]
        filled.add(id(t))
        filled_keys.add(name)
        where = names_of.get(id(t), [name])[0]
        if tuple(t.shape) != tuple(saved.shape):
            shape.append((where, tuple(saved.shape), tuple(t.shape)))
        elif t.dtype != saved.dtype:
            dtype.append((where, saved.dtype, t.dtype))
        elif t.device.type != "meta" and not torch.equal(t.detach().cpu(), saved):
            differ.append(where)
    left = [k for k, t in own.items() if id(t) not in filled and k not in filled_keys]
    # a tensor a conversion built (merged experts...) has no identity in the model: by key
    left += [k for k, t in expected.items() if id(t) not in names_of and k not in filled_keys]
    sev = "warning"
    out: list[Finding] = []
    out += _listed(left, "left-at-init", sev, lambda k: (
        f"{k} is not saved in {path.name} (nor any tensor tied to it): it holds its random "
        "initial value"))
    out += _listed(unexpected, "unexpected-tensor", sev, lambda k: (
        f"{k} is saved in {path.name} but this model has no such tensor; it was not loaded"))
    out += _listed(shape, "shape-changed", "error", lambda s: (
        f"{s[0]} is saved with shape {s[1]} but the model has {s[2]}; it holds its initial value"))
    out += _listed(dtype, "dtype-changed", "warning", lambda s: (
        f"{s[0]} is saved as {str(s[1]).removeprefix('torch.')} but the model holds "
        f"{str(s[2]).removeprefix('torch.')}"))
    out += _listed(differ, "weight-differs", "warning", lambda k: (
        f"{k} differs from the value saved in {path.name} (a tie made it share another saved tensor's "
        "value, or loading changed it)"))
    return out


def _listed(items: list, code: str, severity: str, message: Callable[[Any], str]) -> list[Finding]:
    out = [Finding(code, severity, item if isinstance(item, str) else item[0], message(item))
           for item in items[:MAX_LISTED]]
    if len(items) > MAX_LISTED:
        out.append(Finding(code, severity, "", f"{len(items) - MAX_LISTED} more {code} tensors, not listed"))
    return out


def _tensors_in(f: Finding) -> int:
    """How many tensors one finding of :func:`_listed` stands for."""
    if f.where:
        return 1
    head = f.message.split(" ", 1)[0]
    return int(head) if head.isdigit() else 1


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
    decoder_vocab = getattr(_sub_config(config, "decoder"), "vocab_size", None) or vocab
    if not vocab:
        return None
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
