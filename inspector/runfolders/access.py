"""Which run files the dashboard may open: only those under the runs folders the server was
started with (``model-inspector serve --runs DIR[,DIR...]`` or ``INSPECTOR_RUNS``) or under its
upload folder. Symlinks and ``..`` are resolved first, so neither leads out."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from ..utils.findings import InspectorError
from ..utils.paths import confined

RUNS_ENV = "INSPECTOR_RUNS"
FLAG = "--runs"


def split_dirs(value: str) -> list[str]:
    """``DIR[,DIR...]`` (also ``os.pathsep``-separated) as a list, blanks dropped."""
    return [p.strip() for chunk in value.split(",") for p in chunk.split(os.pathsep) if p.strip()]


def runs_dirs(value: str | None = None, *, check: bool = False) -> list[Path]:
    """The runs folders, resolved: ``value``, else ``$INSPECTOR_RUNS``; none when neither is set.

    Raises:
        InspectorError: with ``check``, a folder that does not exist or is not a folder (named).
    """
    raw = os.environ.get(RUNS_ENV, "") if value is None else value
    out: list[Path] = []
    for part in split_dirs(raw):
        p = Path(part).expanduser().resolve()
        if check and not p.is_dir():
            what = "does not exist" if not p.exists() else "is not a folder"
            raise InspectorError(f"runs folder {part} {what}; give {FLAG} folders that hold run files "
                                 f"(DIR[,DIR...]) or fix {RUNS_ENV}")
        if p not in out:
            out.append(p)
    return out


def refusal(path: str, roots: Iterable[Path]) -> str:
    shown = ", ".join(str(r) for r in roots)
    where = f"the runs folders ({shown})" if shown else "a runs folder (none is configured)"
    return (f"{path} is not under {where}: the server opens run files only there or in its upload folder. "
            f"Start it with `model-inspector serve {FLAG} DIR[,DIR...]` (or set {RUNS_ENV}) to open runs "
            "from another folder, or upload the file")


def allowed_run_path(path: str | os.PathLike, roots: Iterable[Path], extra: Iterable[Path] = ()) -> Path:
    """``path`` resolved, when it is a regular file under one of ``roots`` or ``extra`` (the upload
    folder): :func:`~inspector.utils.paths.confined` with the runs folders.

    A relative path is taken inside each runs folder in turn (the first where it exists), so a
    run's listed name opens it. Symlinks are followed before the check; ``..`` cannot climb out; a
    FIFO or a device is refused before anything opens it.

    Raises:
        InspectorError: the path is elsewhere (the message names ``--runs`` and ``INSPECTOR_RUNS``),
            missing, or not a regular file.
    """
    roots = list(roots)
    return confined(path, roots, extra=extra, kind="file", what="run file",
                    refusal=lambda text: refusal(text, roots))


__all__ = ["FLAG", "RUNS_ENV", "allowed_run_path", "refusal", "runs_dirs", "split_dirs"]
