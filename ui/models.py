"""Loaded models, cached per (source, checkpoint, device, dtype) and shared between sessions."""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from inspector.models import LoadedModel, load_model


@dataclass(frozen=True)
class Selection:
    """What the user picked in the sidebar; the cache key of the loaded model."""

    source: str = "sample:tiny-gpt2"
    checkpoint: str | None = None
    device: str = "cpu"
    dtype: str | None = None

    @property
    def key(self) -> str:
        return f"{self.source}|{self.checkpoint}|{self.device}|{self.dtype}"


@st.cache_resource(show_spinner=False, max_entries=6)
def cached_model(source: str, checkpoint: str | None, device: str, dtype: str | None) -> LoadedModel:
    """One LoadedModel per key for the whole server; guard it with ``loaded.lock``."""
    return load_model(source, checkpoint=checkpoint, device=device, dtype=dtype)


def get_loaded(selection: Selection) -> LoadedModel:
    return cached_model(selection.source, selection.checkpoint, selection.device, selection.dtype)


def save_upload(name: str, data: bytes) -> str:
    """Store an uploaded checkpoint under a content-addressed name; returns its path."""
    digest = hashlib.sha256(data).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "model-inspector-uploads"
    folder.mkdir(exist_ok=True)
    path = folder / f"{digest}-{Path(name).name}"
    if not path.exists():
        path.write_bytes(data)
    return str(path)
