"""A run file followed as it grows: :class:`LiveRun` reads only what was appended since the last read
(:class:`~inspector.runfiles.tail.RunTail` keeps the byte offset and the steps in a few large batches),
so following a run for days costs memory for its numbers, not a copy per refresh."""

from __future__ import annotations

import os
import threading
from typing import Any

from ..runfiles.reading import run_of
from ..runfiles.tables import Run
from ..runfiles.tail import RunTail
from ..utils.findings import InspectorError


class LiveRun:
    """The watch run file ``path``, read on from where the last :meth:`read` stopped.

    ``key`` changes whenever the run read does (new steps, the file closed, or replaced). One object
    may be shared between threads (a dashboard's sessions).
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = str(path)
        self.tail = RunTail(path)
        self._lock = threading.Lock()
        self._run: Run | None = None
        self.key: tuple[Any, ...] = ()

    def read(self) -> Run:
        """The run with every whole step written so far (the same object while the file stands still).

        Raises:
            InspectorError: the file is not a regular file, not a run file, its header is not whole
                yet, or what was appended is damaged (naming the file).
        """
        with self._lock:
            tail = self.tail
            tail.poll()
            if tail.schema is None:
                raise InspectorError(f"{tail.name} has no whole run file header yet (it is empty, or not a "
                                     "watch run file)")
            key = (self.path, tail.generation, tail.offset, tail.closed, tail.cut)
            if self._run is None or key != self.key:
                self._run = None  # the old tables go before the new ones are built
                self._run, self.key = run_of(tail, source=self.path), key
            return self._run


__all__ = ["LiveRun"]
