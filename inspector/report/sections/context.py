"""What every section function gets and how one says it cannot run here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from ..data import Section

Progress = Callable[[str], None]


class SectionUnavailable(Exception):
    """A section cannot be built here; the message says why. It becomes a skipped section."""


@dataclass
class Context:
    """What section functions get: the loaded model, every option, the progress callback."""

    loaded: Any
    options: dict[str, Any]
    progress: Progress

    @property
    def model(self) -> nn.Module:
        return self.loaded.model


SectionBuilder = Callable[[Context], Section]
