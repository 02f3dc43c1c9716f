"""Tiny random Hugging Face models of real architectures, saved with ``save_pretrained``.

Each config is as small as the architecture allows (hidden 16, one layer, vocabulary 64),
so the whole matrix saves in about a second once transformers is imported. Everything is
built locally (no download).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

VOCAB = 64


def _text(tf: Any) -> dict[str, Callable[[], Any]]:
    def llama(tied: bool) -> Callable[[], Any]:
        return lambda: tf.LlamaForCausalLM(
            tf.LlamaConfig(
                vocab_size=VOCAB,
                hidden_size=16,
                intermediate_size=32,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=1,
                max_position_embeddings=32,
                tie_word_embeddings=tied,
            )
        )

    def bert(**extra: Any) -> Any:
        return tf.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=32, max_position_embeddings=32, **extra)

    def t5() -> Any:
        return tf.T5Config(vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2,
                           decoder_start_token_id=0)

    return {
        "gpt2": lambda: tf.GPT2LMHeadModel(
            tf.GPT2Config(
                vocab_size=VOCAB,
                n_positions=32,
                n_embd=16,
                n_layer=1,
                n_head=2,
                bos_token_id=0,
                eos_token_id=0,
            )
        ),
        "bert": lambda: tf.BertForMaskedLM(bert()),
        "t5": lambda: tf.T5ForConditionalGeneration(t5()),
        "t5-bare": lambda: tf.T5Model(t5()),
        "bart": lambda: tf.BartForConditionalGeneration(
            tf.BartConfig(
                vocab_size=VOCAB,
                d_model=16,
                encoder_layers=1,
                decoder_layers=1,
                encoder_attention_heads=2,
                decoder_attention_heads=2,
                encoder_ffn_dim=32,
                decoder_ffn_dim=32,
                max_position_embeddings=32,
            )
        ),
        "llama-tied": llama(True),
        "llama-untied": llama(False),
        "vit": lambda: tf.ViTForImageClassification(
            tf.ViTConfig(
                image_size=8,
                patch_size=4,
                num_channels=3,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                num_labels=3,
            )
        ),
        "bert2bert": lambda: tf.EncoderDecoderModel(
            config=tf.EncoderDecoderConfig.from_encoder_decoder_configs(
                bert(),
                bert(is_decoder=True, add_cross_attention=True),
                decoder_start_token_id=0,
                pad_token_id=0,
            )
        ),
    }


def _families(tf: Any) -> dict[str, Callable[[], Any]]:
    """Families whose loading, inputs or placement need more than token ids: rebuilt positions,
    merged experts, speech, text and image, tied heads with biases."""
    def seq2seq(**k: Any) -> dict[str, Any]:
        return dict(
            vocab_size=VOCAB,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
            **k,
        )

    def vision(**k: Any) -> dict[str, Any]:
        return dict(image_size=8, patch_size=4, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                    num_attention_heads=2, projection_dim=8, **k)

    text = dict(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2, max_position_embeddings=32)
    return {
        "marian": lambda: tf.MarianMTModel(
            tf.MarianConfig(
                **seq2seq(
                    max_position_embeddings=32, pad_token_id=VOCAB - 1, decoder_start_token_id=VOCAB - 1
                )
            )
        ),
        "mixtral": lambda: tf.MixtralForCausalLM(
            tf.MixtralConfig(**text, num_key_value_heads=1, num_local_experts=2, num_experts_per_tok=1)
        ),
        "qwen2-moe": lambda: tf.Qwen2MoeForCausalLM(
            tf.Qwen2MoeConfig(
                **text,
                moe_intermediate_size=8,
                shared_expert_intermediate_size=16,
                num_key_value_heads=1,
                num_experts=2,
                num_experts_per_tok=1,
            )
        ),
        "whisper": lambda: tf.WhisperForConditionalGeneration(
            tf.WhisperConfig(
                **seq2seq(
                    num_mel_bins=8,
                    max_source_positions=8,
                    max_target_positions=16,
                    pad_token_id=0,
                    bos_token_id=1,
                    eos_token_id=2,
                    decoder_start_token_id=1,
                    suppress_tokens=None,
                    begin_suppress_tokens=None,
                )
            )
        ),
        "wav2vec2": lambda: tf.Wav2Vec2ForCTC(
            tf.Wav2Vec2Config(
                vocab_size=VOCAB,
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                conv_dim=(8, 8),
                conv_stride=(5, 2),
                conv_kernel=(10, 3),
                num_conv_pos_embeddings=4,
                num_conv_pos_embedding_groups=2,
                pad_token_id=0,
            )
        ),
        "clip": lambda: tf.CLIPModel(
            tf.CLIPConfig(
                text_config={
                    **text,
                    "max_position_embeddings": 16,
                    "projection_dim": 8,
                    "bos_token_id": 0,
                    "eos_token_id": 2,
                    "pad_token_id": 1,
                },
                vision_config=vision(),
                projection_dim=8,
            )
        ),
        "llava": lambda: tf.LlavaForConditionalGeneration(
            tf.LlavaConfig(
                vision_config=tf.CLIPVisionConfig(**vision()),
                text_config=tf.LlamaConfig(**text, num_key_value_heads=1),
                image_token_index=VOCAB - 1,
                image_seq_length=4,
                vision_feature_layer=-1,
            )
        ),
        "distilbert": lambda: tf.DistilBertForMaskedLM(
            tf.DistilBertConfig(
                vocab_size=VOCAB, dim=16, n_layers=1, n_heads=2, hidden_dim=32, max_position_embeddings=32
            )
        ),
        "roberta": lambda: tf.RobertaForMaskedLM(
            tf.RobertaConfig(**{**text, "max_position_embeddings": 40}, pad_token_id=1)
        ),
    }


ARCHITECTURES = ("gpt2", "bert", "t5", "t5-bare", "bart", "llama-tied", "llama-untied", "vit", "bert2bert")
#: What each architecture is saved as (``config.architectures[0]``).
SAVED_CLASS = {
    "gpt2": "GPT2LMHeadModel",
    "bert": "BertForMaskedLM",
    "t5": "T5ForConditionalGeneration",
    "t5-bare": "T5Model",
    "bart": "BartForConditionalGeneration",
    "llama-tied": "LlamaForCausalLM",
    "llama-untied": "LlamaForCausalLM",
    "vit": "ViTForImageClassification",
    "bert2bert": "EncoderDecoderModel",
    "marian": "MarianMTModel",
    "mixtral": "MixtralForCausalLM",
    "qwen2-moe": "Qwen2MoeForCausalLM",
    "whisper": "WhisperForConditionalGeneration",
    "wav2vec2": "Wav2Vec2ForCTC",
    "clip": "CLIPModel",
    "llava": "LlavaForConditionalGeneration",
    "distilbert": "DistilBertForMaskedLM",
    "roberta": "RobertaForMaskedLM",
}
#: The families beyond token-id text models (run by tests/internals/test_hf_matrix.py's family tests).
FAMILIES = ("marian", "mixtral", "qwen2-moe", "whisper", "wav2vec2", "clip", "llava", "distilbert", "roberta")


def save_all(root: Path) -> dict[str, Path]:
    """Save every architecture under ``root/<name>`` (safetensors); returns the folders."""
    import torch
    import transformers as tf

    out = {}
    for name, build in {**_text(tf), **_families(tf)}.items():
        torch.manual_seed(0)
        build().save_pretrained(root / name)
        out[name] = root / name
    return out
