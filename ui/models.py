"""Loaded models, cached per (source, checkpoint, device, dtype) and shared between sessions.

A model loaded here is one object for the whole server: every browser session that picks
the same source, checkpoint, device and dtype gets the same :class:`LoadedModel`. Anything
that adds hooks or runs forward/backward on it must hold ``loaded.lock``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import streamlit as st

from inspector import LoadedModel, load_model
from ui.paths import server_path, server_source

MAX_CACHED_MODELS = 6


@dataclass(frozen=True)
class Selection:
    """What the user picked in the sidebar; ``key`` is the cache key of the loaded model.

    >>> Selection().key
    'sample:tiny-gpt2|None|cpu|None'
    """

    source: str = "sample:tiny-gpt2"
    checkpoint: str | None = None
    device: str = "cpu"
    dtype: str | None = None
    max_model_size: str | None = None  # the largest Hugging Face model to build (None: the server's default)

    @property
    def key(self) -> str:
        return f"{self.source}|{self.checkpoint}|{self.device}|{self.dtype}" + (
            f"|{self.max_model_size}" if self.max_model_size else "")

    @property
    def label(self) -> str:
        """A short line for people: ``tiny-gpt2 on cpu``."""
        name = self.source.removeprefix("sample:").removeprefix("hf:")
        extra = f", {self.dtype}" if self.dtype else ""
        ckpt = f" + {Path(self.checkpoint).name}" if self.checkpoint else ""
        return f"{name}{ckpt} on {self.device}{extra}"

    def with_device(self, device: str) -> Selection:
        return replace(self, device=device)


def _file_stamp(path: str | None) -> str:
    """Size and modification time of a checkpoint, so a file rewritten on disk loads afresh."""
    if not path:
        return ""
    try:
        st_ = os.stat(path)
    except OSError:
        return "missing"
    return f"{st_.st_size}:{st_.st_mtime_ns}"


@st.cache_resource(show_spinner=False, max_entries=MAX_CACHED_MODELS)
def cached_model(source: str, checkpoint: str | None, device: str, dtype: str | None,
                 stamp: str = "", max_model_size: str | None = None) -> LoadedModel:
    """One LoadedModel per key for the whole server; guard it with ``loaded.lock``.

    ``stamp`` (size and mtime of the checkpoint) is only part of the cache key. A failed
    load raises and caches nothing.
    """
    return load_model(
        source, checkpoint=checkpoint, device=device, dtype=dtype, max_model_size=max_model_size
    )


def get_loaded(selection: Selection) -> LoadedModel:
    """The cached LoadedModel for ``selection`` (loading it on first use). Its paths, typed or from
    the address, pass the path gate first (:mod:`ui.paths`): a refused one raises, named."""
    source = server_source(selection.source)
    checkpoint = server_path(selection.checkpoint) if selection.checkpoint else None
    return cached_model(source, checkpoint, selection.device, selection.dtype,
                        _file_stamp(checkpoint), selection.max_model_size)
