"""Example inputs and a loss for a Hugging Face model, built from its config (no processor code runs).

The main input is the model's ``main_input_name``: token ids (``input_ids``), pixels
(``pixel_values``), log-mel features (``input_features``, Whisper) or raw audio
(``input_values``, Wav2Vec2). Every other input the forward needs is added: pixels for a
text-and-image model (CLIP, and Llava, whose token ids then start with its image tokens so the
vision tower runs), decoder ids for an encoder-decoder, and labels for a model whose loss comes
only from its forward (CTC). Sizes come from the config, else from the folder's
``preprocessor_config.json`` (read as JSON: feature sizes, image sizes).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..utils.findings import InspectorError

SEQUENCE_LENGTH = 8
#: frames of audio that the raw-audio inputs (``input_values``) are sized to give
AUDIO_FRAMES = 8
Part = Callable[[int, torch.Generator], dict[str, torch.Tensor]]


def _sub_config(config: Any, *names: str) -> Any:
    for name in names:
        sub = getattr(config, name, None)
        if sub is not None and not isinstance(sub, (int, float, str, bool)):
            return sub
    return config


def input_kind(model: nn.Module) -> str:
    """``"pixels"`` (vision), ``"audio"`` (features or raw audio), ``"seq2seq"`` (encoder-decoder
    text) or ``"tokens"``."""
    main = getattr(model, "main_input_name", "input_ids")
    if main == "pixel_values":
        return "pixels"
    if main in ("input_features", "input_values"):
        return "audio"
    return "seq2seq" if getattr(getattr(model, "config", None), "is_encoder_decoder", False) else "tokens"


def processor_config(model: nn.Module) -> dict[str, Any]:
    """The folder's ``preprocessor_config.json`` as a dict ({} when there is none)."""
    folder = getattr(model, "name_or_path", None) or getattr(
        getattr(model, "config", None), "_name_or_path", ""
    )
    path = Path(str(folder)) / "preprocessor_config.json" if folder else None
    try:
        data = json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _forward_params(model: nn.Module) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def example_inputs_for(model: nn.Module) -> Callable[[int], dict[str, torch.Tensor]] | None:
    """A function ``batch_size -> inputs`` built from ``model.config`` for every input the forward
    needs; None when the config says too little (no vocabulary size, no image size...)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    params, main = _forward_params(model), getattr(model, "main_input_name", "input_ids")
    proc = processor_config(model)
    parts: list[Part | None] = [MAIN_INPUTS[main](model, config, proc) if main in MAIN_INPUTS else None]
    if main != "pixel_values" and "pixel_values" in params:
        parts.append(_pixels(model, config, proc))
    if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        parts.append(_decoder_ids(config))
    if type(model).__name__.endswith("ForCTC") and "labels" in params:
        parts.append(_ctc_labels(config))
    if any(p is None for p in parts):
        return None
    ready = [p for p in parts if p is not None]

    def build(batch_size: int) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(0)
        out: dict[str, torch.Tensor] = {}
        for part in ready:
            out.update(part(batch_size, gen))
        return out
    return build


def _image_tokens(model: nn.Module, config: Any) -> tuple[int, int] | None:
    """(image token id, tokens per image) of a model that puts image features among its tokens."""
    token = getattr(config, "image_token_index", None)
    token = getattr(config, "image_token_id", None) if token is None else token
    if not isinstance(token, int) or "pixel_values" not in _forward_params(model):
        return None
    vision = _sub_config(config, "vision_config")
    size, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if isinstance(size, int) and isinstance(patch, int) and patch > 0:
        full = getattr(config, "vision_feature_select_strategy", "default") == "full"
        return token, (size // patch) ** 2 + int(full)
    count = getattr(config, "image_seq_length", None)
    return (token, count) if isinstance(count, int) and count > 0 else None


def _token_ids(model: nn.Module, config: Any, proc: dict[str, Any]) -> Part | None:
    text = _sub_config(config, "text_config", "encoder")
    vocab = getattr(text, "vocab_size", None)
    if not isinstance(vocab, int) or vocab <= 1:
        return None
    limit = getattr(text, "max_position_embeddings", None) or getattr(text, "n_positions", None)
    length = min(SEQUENCE_LENGTH, limit) if isinstance(limit, int) and limit > 0 else SEQUENCE_LENGTH
    image = _image_tokens(model, config)

    def tokens(batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab, (batch_size, length), generator=gen)
        if image is not None:  # the image's tokens first, and no other token is an image token
            token, count = image
            ids = torch.where(ids == token, (token + 1) % vocab, ids)
            ids = torch.cat([torch.full((batch_size, count), token, dtype=ids.dtype), ids], dim=1)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    return tokens


def _pixels(model: nn.Module, config: Any, proc: dict[str, Any]) -> Part | None:
    vision = _sub_config(config, "vision_config")
    size = getattr(vision, "image_size", None) or _processor_image_size(proc)
    channels = getattr(vision, "num_channels", 3)
    if not size:
        return None
    h, w = (size, size) if isinstance(size, int) else tuple(size)[:2]

    def pixels(batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"pixel_values": torch.randn(batch_size, channels, h, w, generator=gen)}
    return pixels


def _processor_image_size(proc: dict[str, Any]) -> int | tuple[int, int] | None:
    size = proc.get("crop_size") or proc.get("size")
    if isinstance(size, int):
        return size
    if isinstance(size, dict):
        if isinstance(size.get("height"), int) and isinstance(size.get("width"), int):
            return size["height"], size["width"]
        edge = size.get("shortest_edge")
        return edge if isinstance(edge, int) else None
    return None


def _features(model: nn.Module, config: Any, proc: dict[str, Any]) -> Part | None:
    """Log-mel features ``(batch, mel bins, frames)``: Whisper's encoder takes exactly twice its
    ``max_source_positions`` frames."""
    bins = getattr(config, "num_mel_bins", None) or proc.get("feature_size")
    positions = getattr(config, "max_source_positions", None)
    frames = 2 * positions if isinstance(positions, int) else proc.get("nb_max_frames")
    if not isinstance(bins, int) or not isinstance(frames, int):
        return None

    def features(batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"input_features": torch.randn(batch_size, bins, frames, generator=gen)}
    return features


def _audio(model: nn.Module, config: Any, proc: dict[str, Any]) -> Part | None:
    """Raw audio ``(batch, samples)``, long enough for the feature encoder to give
    :data:`AUDIO_FRAMES` frames (its convolutions' kernels and strides, from the last one back)."""
    kernels, strides = getattr(config, "conv_kernel", None), getattr(config, "conv_stride", None)
    if not kernels or not strides or len(kernels) != len(strides):
        return None
    samples = AUDIO_FRAMES
    for k, s in zip(reversed(kernels), reversed(strides), strict=True):
        samples = (samples - 1) * s + k

    def audio(batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"input_values": torch.randn(batch_size, samples, generator=gen)}
    return audio


def _decoder_ids(config: Any) -> Part | None:
    decoder = _sub_config(config, "decoder", "text_config")
    vocab = getattr(decoder, "vocab_size", None) or getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab <= 0:
        return None
    limit = getattr(config, "max_target_positions", None) or getattr(decoder, "max_position_embeddings", None)
    length = min(SEQUENCE_LENGTH, limit) if isinstance(limit, int) and limit > 0 else SEQUENCE_LENGTH

    def decoder_ids(batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        return {"decoder_input_ids": torch.randint(0, vocab, (batch_size, length), generator=gen)}
    return decoder_ids


def _ctc_labels(config: Any) -> Part | None:
    """CTC targets, half as long as the frames, never the blank (pad) token."""
    vocab, blank = getattr(config, "vocab_size", None), getattr(config, "pad_token_id", 0) or 0
    if not isinstance(vocab, int) or vocab < 2:
        return None

    def labels(batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, vocab - 1, (batch_size, AUDIO_FRAMES // 2), generator=gen)
        return {"labels": ids + (ids >= blank).long()}
    return labels


MAIN_INPUTS: dict[str, Callable[[nn.Module, Any, dict[str, Any]], Part | None]] = {
    "input_ids": _token_ids, "pixel_values": _pixels, "input_features": _features, "input_values": _audio,
}


# ------------------------------------------------------------------------------------------ loss


def loss_for(model: nn.Module) -> Callable[[Any, Any], torch.Tensor] | None:
    """A loss on the model's outputs: cross-entropy against class 0 for classifiers (sequence,
    token or image), next-token cross-entropy for causal LMs (on the decoder ids for
    encoder-decoders), per-token cross-entropy for masked LMs, CLIP's contrastive loss for a
    text-and-image model, the model's own loss on the example labels for CTC. None for a model
    without a head."""
    cls_name = type(model).__name__
    if cls_name.endswith("Classification"):
        return _classify
    if cls_name.endswith("ForCTC"):
        return _own_loss
    if "return_loss" in _forward_params(model):
        return _contrastive
    out_emb = getattr(model, "get_output_embeddings", None)
    if input_kind(model) == "pixels" or not callable(out_emb) or out_emb() is None:
        return None
    masked = cls_name.endswith(("ForMaskedLM", "ForPreTraining"))

    def language(outputs: Any, inputs: Any) -> torch.Tensor:
        logits = _logits(outputs)
        ids = inputs.get("decoder_input_ids", inputs.get("input_ids"))
        if not masked:
            logits, ids = logits[:, :-1], ids[:, 1:]
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids.reshape(-1))
    return language


def _classify(outputs: Any, inputs: Any) -> torch.Tensor:
    logits = _logits(outputs)
    logits = logits.reshape(-1, logits.size(-1))
    return nn.functional.cross_entropy(
        logits, torch.zeros(len(logits), dtype=torch.long, device=logits.device)
    )


def _own_loss(outputs: Any, inputs: Any) -> torch.Tensor:
    loss = getattr(outputs, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise InspectorError(
            "the model returned no loss: its inputs need 'labels' (the example inputs have them)"
        )
    return loss


def _contrastive(outputs: Any, inputs: Any) -> torch.Tensor:
    """CLIP's loss: each image matches the text of the same row, and each text its image."""
    per_image = getattr(outputs, "logits_per_image", None)
    if not isinstance(per_image, torch.Tensor):
        raise InspectorError(
            "the model returned no logits_per_image: it needs both input_ids and pixel_values"
        )
    target = torch.arange(len(per_image), device=per_image.device)
    return (
        nn.functional.cross_entropy(per_image, target) + nn.functional.cross_entropy(per_image.t(), target)
    ) / 2


def _logits(outputs: Any) -> torch.Tensor:
    logits = getattr(outputs, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(outputs, dict) and isinstance(outputs.get("logits"), torch.Tensor):
        return outputs["logits"]
    return outputs[0]
