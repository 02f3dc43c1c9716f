"""The loaded model's tokenizer, where its folder has one, to show tokens as text in figures."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import streamlit as st

from inspector import LoadedModel

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model", "vocab.txt")
log = logging.getLogger("model_inspector.ui")


@st.cache_resource(show_spinner=False, max_entries=4)
def _tokenizer(folder: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)  # never runs code from the folder


def token_decoder(loaded: LoadedModel) -> Callable[[int], str] | None:
    """``id -> text`` with the tokenizer of a Hugging Face folder; None where there is none (samples,
    Python files) or it cannot be read (the figure then shows token ids)."""
    if not loaded.source.startswith("hf:"):
        return None
    folder = Path(loaded.source.removeprefix("hf:"))
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        return None
    try:
        tok = _tokenizer(str(folder))
    except Exception as exc:  # noqa: BLE001 - a broken tokenizer only costs the token texts
        log.warning("no tokenizer for %s: %s", folder, exc)
        return None
    return lambda token: tok.decode([token])
