"""What a finished :func:`~inspector.watching.watch` block gives: its frozen :class:`WatchResult`."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..capture import Captures
from ..runfiles import Run, StepFinding, read_run


@dataclass(frozen=True, eq=False)
class WatchResult:
    """What a finished :func:`watch` block recorded: ``steps`` written to ``path``, every
    finding at the step it began (again at each new episode of a code that recurs), and the
    ``captures`` of the first ``nonfinite-forward`` producer."""

    path: str
    steps: int
    findings: list[StepFinding]
    captures: Captures | None = field(default=None, repr=False)
    completed: bool = True

    def run(self) -> Run:
        """The run file, read back (:func:`read_run`)."""
        return read_run(self.path)


__all__ = ["WatchResult"]
