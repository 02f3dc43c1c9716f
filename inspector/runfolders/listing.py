"""The runs found under the runs folders, as ``tensorboard --logdir`` finds event files: newest
first, the live ones (still written in the last minute and not closed) marked, each with its
first finding. Listing only reads: nothing is written into a runs folder."""

from __future__ import annotations

import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from ..runfiles import END_OF_STREAM, is_run_file
from ..runfiles.guard import regular_fd
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


def first_finding(run: Run) -> StepFinding | None:
    """The earliest finding of ``run`` (as :func:`~inspector.watching.read_run` read it; errors before
    warnings at one step), or None."""
    rank = {"error": 0, "warning": 1, "info": 2}
    ordered = sorted(run.findings, key=lambda f: (f.step, rank.get(f.severity, 3)))
    return ordered[0] if ordered else None


def describe(entry: RunEntry) -> dict[str, object]:
    """One row of the runs table: name, live, modified, steps so far, the first finding (or why
    the file cannot be read: whatever is wrong with one file, its row says so and no other row is
    touched)."""
    row: dict[str, object] = {"run": entry.name, "live": entry.live,
                              "modified": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(entry.modified))}
    try:
        run = read_run(entry.path)
        f = first_finding(run)
        row["steps"] = int(run.steps["step"].nunique()) if len(run.steps) else 0
        row["first finding"] = f"step {f.step}: {f.code} at {module_label(f.where)}" if f else ""
    except InspectorError as exc:
        row["steps"] = None
        row["first finding"] = f"unreadable: {exc}"
    except Exception as exc:  # noqa: BLE001 - one bad file never breaks the listing of the others
        row["steps"] = None
        row["first finding"] = f"unreadable: {type(exc).__name__} while reading it ({str(exc)[:200]})"
    return row


__all__ = ["LIVE_S", "RunEntry", "describe", "first_finding", "list_runs"]
