"""Argument checks at the public functions' boundary: a clear InspectorError, never an
AttributeError from deep inside an analysis."""

from __future__ import annotations

from typing import Any

from torch import nn

from .findings import InspectorError


def require_module(model: Any, what: str) -> nn.Module:
    """The model under any ``torch.compile`` / DDP / FSDP wrappers of ``model`` (see
    :mod:`inspector.utils.wrappers`); an InspectorError naming ``what`` if ``model`` is no ``nn.Module``.
    Every entry point uses the returned module, so names are those the user wrote.

    >>> require_module(None, "offset_map")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    ...
    inspector.utils.findings.InspectorError: offset_map needs a torch nn.Module (a model), got NoneType;
    load one with load_model(...)
    """
    if not isinstance(model, nn.Module):
        raise InspectorError(f"{what} needs a torch nn.Module (a model), got {type(model).__name__}; "
                             "load one with load_model(...)")
    from .wrappers import underlying

    return underlying(model)


def require_loaded(loaded: Any, what: str) -> Any:
    """``loaded`` if it looks like a LoadedModel (has an ``nn.Module`` in ``.model``)."""
    if not isinstance(getattr(loaded, "model", None), nn.Module):
        raise InspectorError(f"{what} needs a LoadedModel (from load_model(...)), got "
                             f"{type(loaded).__name__}")
    return loaded
