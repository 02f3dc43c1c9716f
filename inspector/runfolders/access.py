"""Which files the dashboard may open. Run files: only those under the runs folders the server was
started with (``model-inspector serve --runs DIR[,DIR...]`` or ``INSPECTOR_RUNS``) or under its
upload folder. Checkpoints and model folders: under the data folders (``INSPECTOR_DATA_DIRS``,
:func:`data_dirs`) when they are set; ``serve`` sets them for a shared server (:func:`shared_data_dirs`).
Symlinks and ``..`` are resolved first, so neither leads out."""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ..utils.findings import InspectorError
from ..utils.paths import confined

RUNS_ENV = "INSPECTOR_RUNS"
FLAG = "--runs"
DATA_ENV = "INSPECTOR_DATA_DIRS"
ANY_FOLDER = "*"  # INSPECTOR_DATA_DIRS=* : checkpoints and model folders from any folder the server reads


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


def data_dirs(value: str | None = None) -> list[Path] | None:
    """The folders checkpoints and model folders may be read from: ``value``, else ``$INSPECTOR_DATA_DIRS``
    (``DIR[,DIR...]``), resolved; None (any folder the server can read) when it is not set or is ``*``.

    >>> data_dirs("*") is None and data_dirs("") is None
    True
    """
    raw = os.environ.get(DATA_ENV, "") if value is None else value
    if raw.strip() == ANY_FOLDER:
        return None
    return [Path(p).expanduser().resolve() for p in split_dirs(raw)] or None


def shared_data_dirs(runs: Iterable[Path], cwd: Path) -> list[Path]:
    """The data folders of a shared server whose ``INSPECTOR_DATA_DIRS`` is not set: its runs folders
    and the working directory, resolved, each once."""
    out: list[Path] = []
    for p in (*runs, cwd):
        p = Path(p).resolve()
        if p not in out:
            out.append(p)
    return out


def listen_address(extra: Sequence[str], env: Mapping[str, str]) -> str:
    """The address streamlit will listen on as given (``--server.address X`` or ``=X`` among ``extra``,
    else ``$STREAMLIT_SERVER_ADDRESS``); "" when none is given."""
    address = env.get("STREAMLIT_SERVER_ADDRESS", "")
    for i, word in enumerate(extra):
        if word == "--server.address" and i + 1 < len(extra):
            address = extra[i + 1]
        elif word.startswith("--server.address="):
            address = word.split("=", 1)[1]
    return address.strip()


def is_loopback(address: str) -> bool:
    """Whether ``address`` (an IP address or ``localhost``) reaches this machine only."""
    if address.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: other machines may reach it


def data_settings(runs: Sequence[Path], extra: Sequence[str], env: Mapping[str, str],
                  cwd: Path) -> tuple[dict[str, str], str]:
    """``(environment to add, the line said at start)``: where the server reads checkpoints and model
    folders from. A shared server (runs folders given, or an address other machines reach) without
    ``INSPECTOR_DATA_DIRS`` is confined to its runs folders and ``cwd``; an explicit setting holds as it
    is (``*``: any folder)."""
    address = listen_address(extra, env)
    shared = [why for why, on in (("--runs folders", bool(runs)),
                                  (f"address {address}", bool(address) and not is_loopback(address))) if on]
    raw = env.get(DATA_ENV, "").strip()
    if raw:
        roots = data_dirs(raw)
        where = "any folder the server can read" if roots is None else ", ".join(str(r) for r in roots)
        return {}, f"checkpoints and model folders: {where} ({DATA_ENV}) and uploads"
    if not shared:
        return {}, (f"checkpoints and model folders: any folder the server can read (a local server; "
                    f"{DATA_ENV}=DIR[,DIR...] confines them)")
    roots = shared_data_dirs(runs, cwd)
    return {DATA_ENV: ",".join(str(r) for r in roots)}, (
        f"shared server ({' and '.join(shared)}): checkpoints and model folders are read only under "
        f"{', '.join(str(r) for r in roots)} and uploads; set {DATA_ENV}=DIR[,DIR...] to name the folders, "
        f"or {DATA_ENV}='{ANY_FOLDER}' to open every folder the server can read")
