"""Tiny random Hugging Face models of real architectures, saved with ``save_pretrained``.

Each config is as small as the architecture allows (hidden 16, one layer, vocabulary 64),
so the whole matrix saves in well under a second once transformers is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

VOCAB = 64


def _text(tf: Any) -> dict[str, Callable[[], Any]]:
    def llama(tied: bool) -> Callable[[], Any]:
        return lambda: tf.LlamaForCausalLM(tf.LlamaConfig(
            vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=1, max_position_embeddings=32, tie_word_embeddings=tied))

    def bert(**extra: Any) -> Any:
        return tf.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                             intermediate_size=32, max_position_embeddings=32, **extra)

    return {
        "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
            vocab_size=VOCAB, n_positions=32, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)),
        "bert": lambda: tf.BertForMaskedLM(bert()),
        "t5": lambda: tf.T5ForConditionalGeneration(tf.T5Config(
            vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, decoder_start_token_id=0)),
        "t5-bare": lambda: tf.T5Model(tf.T5Config(
            vocab_size=VOCAB, d_model=16, d_kv=8, d_ff=32, num_layers=1, num_heads=2, decoder_start_token_id=0)),
        "bart": lambda: tf.BartForConditionalGeneration(tf.BartConfig(
            vocab_size=VOCAB, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32)),
        "llama-tied": llama(True),
        "llama-untied": llama(False),
        "vit": lambda: tf.ViTForImageClassification(tf.ViTConfig(
            image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            intermediate_size=32, num_labels=3)),
        "bert2bert": lambda: tf.EncoderDecoderModel(config=tf.EncoderDecoderConfig.from_encoder_decoder_configs(
            bert(), bert(is_decoder=True, add_cross_attention=True), decoder_start_token_id=0, pad_token_id=0)),
    }


ARCHITECTURES = ("gpt2", "bert", "t5", "t5-bare", "bart", "llama-tied", "llama-untied", "vit", "bert2bert")
#: What each architecture is saved as (``config.architectures[0]``).
SAVED_CLASS = {"gpt2": "GPT2LMHeadModel", "bert": "BertForMaskedLM", "t5": "T5ForConditionalGeneration",
               "t5-bare": "T5Model",
               "bart": "BartForConditionalGeneration", "llama-tied": "LlamaForCausalLM",
               "llama-untied": "LlamaForCausalLM", "vit": "ViTForImageClassification",
               "bert2bert": "EncoderDecoderModel"}


def save_all(root: Path) -> dict[str, Path]:
    """Save every architecture under ``root/<name>`` (safetensors); returns the folders."""
    import torch
    import transformers as tf

    out = {}
    for name, build in _text(tf).items():
        torch.manual_seed(0)
        build().save_pretrained(root / name)
        out[name] = root / name
    return out
