"""Local Hugging Face model folders: the saved class, a check of every saved tensor, example inputs.

A folder written by ``save_pretrained`` names the class it was saved from in
``config.json`` (``architectures``). :func:`load_hf_folder` loads that class; only when the
folder names none that transformers knows does it fall back, in this order, to the first of
:data:`FALLBACK_AUTO_CLASSES` that has a class for the config. Then it compares every saved
tensor with the model (:func:`inspector.loading.hf_saved.check_saved`, from the files' headers and
transformers' loading report; values are read only where they may differ): a saved tensor the
model has no place for, a model tensor no saved tensor filled (left at its random
initialisation), a shape or dtype that changed, or a value that differs become findings. When
saved tensors were dropped *and* model tensors were left at their initial values (or shapes
changed), the model is not the
saved one: those findings are errors, and so is the class finding when the class is not the
one the folder names.

Example inputs and the loss come from the config (:mod:`inspector.loading.hf_inputs`): every input the
forward needs, for text, vision, speech and text-and-image models.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..utils.findings import Finding, InspectorError, Severity
from .hf_inputs import example_inputs_for, input_kind, loss_for
from .hf_limits import check_folder_files, check_model_size, saved_architectures
from .hf_saved import SavedCheck, check_saved

__all__ = ["ClassChoice", "choose_class", "example_inputs_for", "input_kind", "load_hf_folder", "loss_for",
           "mismatch_finding"]

#: Auto-class mappings tried, in this order, when ``config.architectures`` names no class
#: transformers knows: a causal language-model head first (for an encoder-decoder config the
#: text and speech sequence-to-sequence heads first), then image-text-to-text, masked LM, image
#: classification, speech recognition (CTC), audio and sequence classification, the bare model
#: last. The first class with a place for every saved tensor wins (:func:`choose_class`).
FALLBACK_AUTO_CLASSES: tuple[str, ...] = (
    "MODEL_FOR_CAUSAL_LM_MAPPING",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING",
    "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING",
    "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING",
    "MODEL_FOR_MASKED_LM_MAPPING",
    "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING",
    "MODEL_FOR_CTC_MAPPING",
    "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING",
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING",
    "MODEL_MAPPING",
)
#: The sequence-to-sequence mappings an encoder-decoder config tries first.
ENCODER_DECODER_FIRST = ("MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING")


@dataclass(frozen=True)
class ClassChoice:
    """Which class loads a folder, and why.

    ``saved`` is the first name in ``config.architectures`` (None when it names none);
    ``chosen`` is the class used; ``is_saved`` says whether they are the same. ``exists`` is
    False when transformers has no class of the saved name (True when it has one for another
    config).
    """

    chosen: Any  # a transformers PreTrainedModel subclass
    saved: str | None
    reason: str
    exists: bool = False

    @property
    def is_saved(self) -> bool:
        return self.saved is not None and self.chosen.__name__ == self.saved


def choose_class(config: Any, saved_keys: Collection[str] | None = None) -> ClassChoice:
    """The class named in ``config.architectures``, else the first fallback that fits the config.

    Only classes of transformers itself are considered (no code from the folder). With
    ``saved_keys`` (the names in the folder's weight files), a fallback is built on the meta
    device and passed over when some saved tensor has no place in it (a causal-LM head for a
    saved Whisper, which has an encoder).

    >>> from transformers import GPT2Config
    >>> cfg = GPT2Config(architectures=["GPT2LMHeadModel"])
    >>> choose_class(cfg).chosen.__name__
    'GPT2LMHeadModel'
    >>> choose_class(GPT2Config()).chosen.__name__  # none named: a language-model head first
    'GPT2LMHeadModel'
    """
    import transformers

    names = saved_architectures(config)
    exists: Any = None
    for name in names:
        cls = getattr(transformers, name, None) if name.isidentifier() else None
        if (
            isinstance(cls, type)
            and issubclass(cls, transformers.PreTrainedModel)
            and cls.config_class is not None
        ):
            if isinstance(config, cls.config_class):
                return ClassChoice(cls, names[0], f"config.architectures names {name}", True)
            exists = exists or cls
    if exists is not None:
        why = (f"config.architectures names {exists.__name__}, a class for {exists.config_class.__name__}, "
               f"but config.json describes a {type(config).__name__} (model_type "
               f"{getattr(config, 'model_type', '?')!r})")
    elif names:
        why = f"transformers has no class {names[0]!r} (config.architectures) for {type(config).__name__}"
    else:
        why = "config.architectures names no class"
    candidates = _fallbacks(config)
    if not candidates:
        raise InspectorError(f"transformers has no model class for {type(config).__name__} "
                             f"(model_type {getattr(config, 'model_type', '?')!r})")
    mapping_name, cls, unused = candidates[0][0], candidates[0][1], None
    if saved_keys is not None:  # the first with no saved tensor unused, else the fewest (the first of equal)
        for m, c in candidates:
            count = _unused_count(c, config, saved_keys)
            if unused is None or count < unused:
                mapping_name, cls, unused = m, c, count
            if count == 0:
                break
    placed = (
        ""
        if unused is None
        else (
            ", the first fallback with a place for every saved tensor"
            if unused == 0
            else f", the fallback that leaves the fewest saved tensors unused ({unused})"
        )
    )
    return ClassChoice(
        cls,
        names[0] if names else None,
        f"{why}; {mapping_name} gives {cls.__name__}{placed}",
        exists is not None,
    )


def _fallbacks(config: Any) -> list[tuple[str, Any]]:
    """(mapping name, class) for each fallback mapping that has a class for ``config``, in order."""
    from transformers.models.auto import modeling_auto

    order = list(FALLBACK_AUTO_CLASSES)
    if getattr(config, "is_encoder_decoder", False):
        order = [*ENCODER_DECODER_FIRST, *(m for m in order if m not in ENCODER_DECODER_FIRST)]
    out: list[tuple[str, Any]] = []
    for mapping_name in order:
        try:
            cls = getattr(modeling_auto, mapping_name)[type(config)]
        except KeyError:
            continue
        if all(cls is not c for _, c in out):
            out.append((mapping_name, cls))
    return out


def _unused_count(cls: Any, config: Any, saved_keys: Collection[str]) -> int:
    """How many saved tensors ``cls`` (built on the meta device) has no place for."""
    gap = saved_gap(cls, config, saved_keys)
    return len(saved_keys) + 1 if gap is None else len(gap[0])


def saved_gap(cls: Any, config: Any, saved_keys: Collection[str]) -> tuple[list[str], list[str]] | None:
    """(saved names ``cls`` has no place for, names it would save that the folder lacks), from the
    class built on the meta device (nothing allocated); None when it cannot be built."""
    from .hf_saved import _candidates, saved_form

    try:
        with torch.device("meta"):
            model = cls(config)
    except Exception:  # noqa: BLE001 - a class that cannot be built for this config
        return None
    expected = saved_form(model, model.state_dict())
    prefix = getattr(model, "base_model_prefix", "") or ""
    unused = [k for k in saved_keys if not any(c in expected for c in _candidates(k, prefix))]
    placed = {c for k in saved_keys for c in _candidates(k, prefix)}
    return unused, [k for k in expected if k not in placed]


def load_hf_folder(path: Path, max_bytes: int | None = None) -> tuple[nn.Module, list[Finding]]:
    """Load the model saved in ``path`` (eval mode, on the CPU) and check it against the saved files.

    ``max_bytes``: the largest model built (estimated on the meta device first; see
    :func:`inspector.loading.hf_limits.check_model_size`).
    A shape in ``config.json`` that differs from a saved one does not stop the load: the model
    is loaded with that tensor at its initial value, and the findings say it is not the saved model.

    Raises:
        InspectorError: the folder cannot be read, transformers has no class for it, or it is too large.
    """
    check_folder_files(path)
    model, loading, choice = _load_with_report(path, max_bytes)
    model.eval()
    check = check_saved(model, path, loading)
    checked = check.findings()
    mismatch = mismatch_finding(check, guessed=not choice.is_saved)
    if mismatch is not None:  # not the saved model: what would be warnings are errors
        checked = [mismatch, *(_as_error(f) if f.code in ("unexpected-tensor", "left-at-init") else f
                               for f in checked)]
    return model, [*class_findings(choice, matches=mismatch is None), *tie_findings(model), *checked]


def _load_with_report(path: Path, max_bytes: int | None) -> tuple[nn.Module, dict[str, Any], ClassChoice]:
    """``from_pretrained`` of the chosen class with its loading report (after the size check); shapes
    that differ from the saved ones are loaded at their initial values (``ignore_mismatched_sizes``)."""
    from .hf_saved import SavedFiles, saved_files

    choice, config = None, None
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
        choice = choose_class(config)
        if not choice.is_saved:  # a fallback: the first class with a place for every saved tensor
            with SavedFiles(saved_files(path)) as saved:
                choice = choose_class(config, list(saved.shapes))
        check_model_size(choice.chosen, config, path, max_bytes)
        model, loading = choice.chosen.from_pretrained(path, local_files_only=True, trust_remote_code=False,
                                                       output_loading_info=True, ignore_mismatched_sizes=True)
    except InspectorError:
        raise
    except Exception as exc:
        message, lacking = (
            _without_pointer(str(exc)),
            _lacking(path, choice, config) if choice is not None else "",
        )
        message = message.rstrip(". ") + lacking if lacking else message
        raise InspectorError(f"loading the Hugging Face model in {path} failed: {type(exc).__name__}: "
                             f"{message}") from exc
    return model, loading, choice


def _lacking(path: Path, choice: ClassChoice, config: Any) -> str:
    """What the folder lacks for the chosen class (a merge of experts needs every expert's tensors)."""
    from .hf_saved import SavedFiles, saved_files

    try:
        with SavedFiles(saved_files(path)) as saved:
            gap = saved_gap(choice.chosen, config, list(saved.shapes))
    except Exception:  # noqa: BLE001 - this only adds detail to a message
        return ""
    if not gap or not gap[1]:
        return ""
    names = ", ".join(gap[1][:5]) + (f" and {len(gap[1]) - 5} more" if len(gap[1]) > 5 else "")
    return f". {choice.chosen.__name__} needs saved tensors the folder does not hold: {names}"


def _without_pointer(message: str) -> str:
    """transformers' message without its pointer to a report that is not shown here."""
    for tail in ("For details look at the `CONVERSION` entries of the above report!",
                 "For details look at the above report!"):
        if tail in message:
            return message.replace(" " + tail, "").replace(tail, "").rstrip()
    return message


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
    return [
        Finding(
            "hf-tie-skipped",
            "warning",
            f"{a}.weight",
            f"config.json says tie_word_embeddings, but {a}.weight and {b}.weight are two tensors: "
            "the folder saved two different values, so transformers kept both. Set "
            "tie_word_embeddings to false, or, if they should be one tensor, tie them (model.tie_weights()) "
            "and save the folder again; the aliases view lists them apart, as two tensors",
        )
    ]


def mismatch_finding(check: SavedCheck, guessed: bool = False) -> Finding | None:
    """An error when saved tensors were dropped *and* model tensors were left at their initial
    value (or a shape changed), or when a class other than the saved one (``guessed``) leaves
    saved tensors unused: the model is then not the one saved in the folder."""
    if check.is_saved_model and not (guessed and check.unexpected):
        return None
    parts = [f"{len(check.unexpected)} saved tensors have no place in it" if check.unexpected else "",
             f"{len(check.left)} of its tensors hold random initial values" if check.left else "",
             f"{len(check.shape)} tensors have another shape than the saved ones (config.json does not "
             "describe the saved tensors; fix it or save the folder again)" if check.shape else ""]
    return Finding("hf-not-saved-model", "error", "",
                   f"this is not the model saved in {check.folder}: {'; '.join(p for p in parts if p)}. "
                   "Its outputs and every number derived from them are not the saved model's")


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
    fix = ("Name a class for this config in 'architectures' in config.json, or fix its model_type"
           if choice.exists else f"Install a transformers version that has {choice.saved}, or fix "
           "'architectures' in config.json")
    return [
        Finding(
            "hf-class-differs",
            severity,
            "",
            f"the folder was saved from {choice.saved}, but this model is a {name} ({choice.reason}); "
            f"{tail}. {fix}",
        )
    ]


def _as_error(f: Finding) -> Finding:
    return Finding(f.code, "error", f.where, f.message) if f.severity == "warning" else f
