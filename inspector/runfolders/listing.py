"""The runs found under the runs folders, as ``tensorboard --logdir`` finds event files: newest
first, the live ones (still written in the last minute and not closed) marked, each with its
first finding. Listing only reads: nothing is written into a runs folder."""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..runfiles import END_OF_STREAM, is_run_file
from ..runfiles.frames import finding_rows
from ..runfiles.guard import regular_fd
from ..runfiles.tail import RunTail
from ..utils.findings import InspectorError
from ..utils.labels import module_label
from ..watching import Run, StepFinding, is_watch_file, read_run

SUFFIXES = (".inspect", ".arrow", ".jsonl")
LIVE_S = 60.0
MAX_DEPTH = 6
MAX_RUNS = 500


@dataclass(frozen=True)
class RunEntry:
    """One run file under a runs folder; ``name`` is its path inside the folder (with the folder's
    own name in front when several are configured)."""

    name: str
    path: Path
    root: Path
    modified: float
    size: int
    live: bool

    @property
    def label(self) -> str:
        return f"{'● live · ' if self.live else ''}{self.name}"


def _closed(path: Path, size: int) -> bool:
    if size < 8:
        return False
    fd = regular_fd(path)
    try:
        return os.pread(fd, 8, size - 8) == END_OF_STREAM
    finally:
        os.close(fd)


def _is_run(path: Path) -> bool:
    if path.suffix == ".jsonl":
        return bool(is_run_file(path))
    return is_watch_file(path)


def list_runs(roots: list[Path], *, now: float | None = None, live_s: float = LIVE_S,
              limit: int = MAX_RUNS) -> list[RunEntry]:
    """Every run file under ``roots`` (``.inspect``/``.arrow`` watch files, ``check_step`` ``.jsonl``),
    newest first, at most ``limit``. Symlinks are not followed; files that only look like runs
    by name are left out.

    Raises:
        InspectorError: a folder that does not exist (named, with how to fix it).
    """
    now = time.time() if now is None else now
    found: list[RunEntry] = []
    for root in roots:
        if not root.is_dir():
            raise InspectorError(f"runs folder {root} does not exist (any more); fix --runs or "
                                 "INSPECTOR_RUNS")
        prefix = f"{root.name}/" if len(roots) > 1 else ""
        for folder, dirs, files in os.walk(root, followlinks=False):
            depth = len(Path(folder).relative_to(root).parts)
            dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if depth < MAX_DEPTH else []
            for f in files:
                p = Path(folder) / f
                if p.suffix not in SUFFIXES or p.is_symlink():
                    continue
                try:
                    st = p.stat()
                    if not stat.S_ISREG(st.st_mode) or not _is_run(p):  # a FIFO or device is never opened
                        continue
                    closed = p.suffix != ".jsonl" and _closed(p, st.st_size)
                except (OSError, InspectorError):
                    continue
                live = not closed and now - st.st_mtime <= live_s
                name = prefix + str(p.relative_to(root))
                found.append(RunEntry(name, p, root, st.st_mtime, st.st_size, live))
    found.sort(key=lambda e: (-e.modified, e.name))
    return found[:limit]


def first_finding(run: Run | list[StepFinding]) -> StepFinding | None:
    """The earliest finding of ``run`` (as :func:`~inspector.watching.read_run` read it, or its findings;
    errors before warnings at one step), or None."""
    found = run if isinstance(run, list) else run.findings
    return min(found, key=_order) if found else None


def _whole(path: Path) -> tuple[int, StepFinding | None, bool]:
    run = read_run(path)
    return (int(run.steps["step"].nunique()) if len(run.steps) else 0), first_finding(run), run.complete


class RunSummary:
    """What a row of the runs table says about one watch run file (its steps so far, its first finding),
    read on from where the last :meth:`read` stopped: a growing run costs only its new steps, and memory
    for its step numbers, not its tables."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.tail = RunTail(path, keep=False)
        self._steps: set[int] = set()
        self._first: StepFinding | None = None
        self.failed = False  # a run-failed finding was read: the run ended by an exception

    def read(self) -> tuple[int, StepFinding | None]:
        """``(steps, first finding)`` so far.

        Raises:
            InspectorError: the file is not a watch run file, or is damaged (naming it).
        """
        import pyarrow as pa

        self.tail.poll()
        if self.tail.schema is None:
            raise InspectorError(f"{self.tail.name} has no whole run file header yet")
        for batch in self.tail.fresh:
            self._steps.update(np.unique(batch.column("step").to_numpy()).tolist())
            found = [StepFinding(*row) for row in finding_rows(pa.Table.from_batches([batch]))]
            self.failed = self.failed or any(f.code == "run-failed" for f in found)
            first = first_finding(found)
            if first is not None and (self._first is None or _order(first) < _order(self._first)):
                self._first = first
        return len(self._steps), self._first


_SEVERITY = {"error": 0, "warning": 1, "info": 2}


def _order(f: StepFinding) -> tuple[int, int]:
    return f.step, _SEVERITY.get(f.severity, 3)


def describe(entry: RunEntry, summary: RunSummary | None = None) -> dict[str, object]:
    """One row of the runs table: name, live, modified, steps so far, the first finding (or why
    the file cannot be read: whatever is wrong with one file, its row says so and no other row is
    touched), and whether the run is complete (its writer closed the file, and no exception ended it).
    ``summary``: the entry's :class:`RunSummary` kept between calls (a watch run file's row then reads
    only what was appended)."""
    row: dict[str, object] = {"run": entry.name, "live": entry.live,
                              "modified": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.modified))}
    try:
        if summary is not None and is_watch_file(entry.path):
            steps, f = summary.read()
            complete = summary.tail.closed and not summary.failed
        else:
            steps, f, complete = _whole(entry.path)
        row["steps"] = steps
        row["first finding"] = f"step {f.step:,}: {f.code} at {module_label(f.where)}" if f else ""
        row["complete"] = complete
    except InspectorError as exc:
        row["steps"] = None
        row["first finding"] = f"unreadable: {exc}"
        row["complete"] = False
    except Exception as exc:  # noqa: BLE001 - one bad file never breaks the listing of the others
        row["steps"] = None
        row["first finding"] = f"unreadable: {type(exc).__name__} while reading it ({str(exc)[:200]})"
        row["complete"] = False
    return row


__all__ = ["LIVE_S", "RunEntry", "RunSummary", "describe", "first_finding", "list_runs"]
