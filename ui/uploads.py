"""Uploaded checkpoints: private to the user running the server, one folder per browser session,
removed when the session ends.

Uploads live under a per-user folder, ``<runtime dir>/model-inspector-uploads-<uid>`` (``$XDG_RUNTIME_DIR``
when it is the user's own folder, else the system temp dir), made with owner-only permissions (0700): in
it each server has its folder, ``<pid>-<random>/`` (0700), removed when the server exits, and in that
each browser session its own (0700), where an upload is one file (0600) the loader reads by path (only
ever with safetensors or ``torch.load(weights_only=True)``). No other local user can list or read them.
The session's folder belongs to an :class:`UploadStore` kept in the session's state: when Streamlit drops
the session, the store is collected and its folder removed. Folders left by a server that is no longer
running (one that was killed) are removed when a server starts (:func:`sweep_once`); folders of other
running servers are left alone, and the sweep never follows a symbolic link (a link is removed, never
what it points to; a root that is a link is not swept). All uploads of a server together may take at
most ``INSPECTOR_UPLOAD_LIMIT`` bytes (default 8 GiB, twice the largest single upload the server
accepts); an upload that does not fit is refused, not stored.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import uuid
import weakref
from pathlib import Path

from inspector import InspectorError, format_bytes
from inspector.utils import confined

UPLOAD_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f/\\\\\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
DEFAULT_LIMIT = 8 << 30
_SESSION_KEY = "mi_uploads"
_lock = threading.Lock()
_live: weakref.WeakSet[UploadStore] = weakref.WeakSet()
_swept = False
_server: tuple[int, Path] | None = None  # (pid, this server's folder), made on first use


def _own_folder(path: Path) -> bool:
    """Whether ``path`` is a real folder (not a link) of this user that only this user can enter."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def _private_folder(path: Path) -> Path | None:
    """``path`` made (0700) or found as this user's own folder (its permissions narrowed to 0700), or
    None when something else holds the name (a link, a file, another user's folder)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return None
    try:
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and st.st_mode & 0o077:
            os.chmod(path, 0o700, follow_symlinks=False)
    except (OSError, NotImplementedError):
        return None
    return path if _own_folder(path) else None


def upload_base() -> Path:
    """The user's private folder of uploads (every server of this user keeps its folder in it)."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    parent = Path(runtime) if runtime and _own_folder(Path(runtime)) else Path(tempfile.gettempdir())
    return parent / f"model-inspector-uploads-{os.getuid()}"


def upload_dir() -> Path:
    """This server's folder of uploads (0700; made on first use, removed when the process exits). When
    the user's folder cannot be made private (another user or a link holds its name), a fresh private
    folder of the temp dir is used instead."""
    global _server
    with _lock:
        if _server is not None and _server[0] == os.getpid():
            return _server[1]
        base = _private_folder(upload_base())
        if base is not None:
            folder = base / f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
            os.mkdir(folder, 0o700)
        else:
            folder = Path(tempfile.mkdtemp(prefix=f"model-inspector-uploads-{os.getpid()}-"))
        atexit.register(shutil.rmtree, str(folder), True)
        _server = (os.getpid(), folder)
        return folder


def upload_limit() -> int:
    """Bytes all uploads together may take: ``INSPECTOR_UPLOAD_LIMIT`` or 8 GiB."""
    raw = os.environ.get("INSPECTOR_UPLOAD_LIMIT", "").strip()
    if not raw:
        return DEFAULT_LIMIT
    try:
        from inspector.placement import parse_size

        return parse_size(raw, "INSPECTOR_UPLOAD_LIMIT")
    except InspectorError:
        return DEFAULT_LIMIT


def folder_bytes(folder: Path) -> int:
    """Total size of the files below ``folder`` (0 if it does not exist)."""
    total = 0
    for root, _, files in os.walk(folder):
        for name in files:
            try:
                total += (Path(root) / name).stat().st_size
            except OSError:
                pass
    return total


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def sweep_stale_uploads(root: Path | None = None) -> list[Path]:
    """Remove what no live session owns under ``root`` (default: the user's folder of uploads, see
    :func:`upload_base`): folders of servers that are not running, folders of this server whose store
    is gone (never this server's own folder), and anything else an hour old. Folders of other running
    servers stay. No link is followed: a link is an entry like a file (removed itself when an hour old),
    a folder is removed without entering a link inside it, and a ``root`` that is a link, or not a
    folder of this user, is not swept at all. Returns what was removed.
    """
    root = upload_base() if root is None else root
    try:
        st = os.lstat(root)
    except OSError:
        return []
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        return []
    owned = {store.folder for store in list(_live)}
    mine = _server[1] if _server is not None and _server[0] == os.getpid() else None
    removed = []
    with os.scandir(root) as entries:
        for item in entries:
            entry = Path(item.path)
            folder = item.is_dir(follow_symlinks=False)
            pid_text = item.name.partition("-")[0]
            pid = int(pid_text) if pid_text.isdigit() and folder else None
            if entry in owned or entry == mine or (pid is not None and pid != os.getpid() and _running(pid)):
                continue
            if pid is None:
                try:
                    age = time.time() - item.stat(follow_symlinks=False).st_mtime
                except OSError:  # removed meanwhile (another server's sweep)
                    continue
                if age < 3600:
                    continue  # not a session folder: only removed once it is an hour old
            if folder:
                shutil.rmtree(entry, ignore_errors=True)  # fd-based: it never follows a link inside
            else:
                try:
                    entry.unlink()  # a file or a link (never what the link points to)
                except FileNotFoundError:
                    pass
                except OSError:
                    continue
            removed.append(entry)
    return removed


def sweep_once() -> None:
    """:func:`sweep_stale_uploads` of the user's folder of uploads, once per server process."""
    global _swept
    with _lock:
        if _swept:
            return
        _swept = True
    sweep_stale_uploads()


class UploadStore:
    """The uploads of one browser session, in a folder of its own removed with the store.

    >>> import tempfile, gc
    >>> parent = tempfile.TemporaryDirectory()
    >>> store = UploadStore(Path(parent.name))
    >>> path = Path(store.save("w.safetensors", b"1234"))
    >>> path.read_bytes(), path.parent == store.folder
    (b'1234', True)
    >>> folder = store.folder; del store; _ = gc.collect()
    >>> folder.exists()
    False
    >>> parent.cleanup()
    """

    def __init__(self, root: Path | None = None, limit: int | None = None) -> None:
        self.shared = root is None  # in this server's folder: the first save sweeps old servers' folders
        self.root = upload_dir() if root is None else root
        self.folder = self.root / f"{os.getpid()}-{uuid.uuid4().hex}"
        self.limit = limit
        self._finalizer = weakref.finalize(self, shutil.rmtree, str(self.folder), True)
        with _lock:
            _live.add(self)

    def save(self, name: str, data: bytes) -> str:
        """Store one uploaded checkpoint; returns its path. InspectorError if refused."""
        base = _UNSAFE.sub("_", Path(name).name)  # only a name: no NUL, line break, override or separator
        if not base.lower().endswith(UPLOAD_SUFFIXES):
            raise InspectorError(f"uploaded file {base!r} is not a checkpoint; use one of "
                                 f"{', '.join(UPLOAD_SUFFIXES)}")
        limit = upload_limit() if self.limit is None else self.limit
        digest = hashlib.sha256(data).hexdigest()[:16]
        path = self.folder / f"{digest}-{base}"
        if self.shared:
            sweep_once()
        with _lock:
            if path.exists():
                return str(path)
            used = folder_bytes(self.root)
            if used + len(data) > limit:
                raise InspectorError(
                    f"upload {base!r} ({format_bytes(len(data))}) was refused: uploads may take "
                    f"{format_bytes(limit)} in all and {format_bytes(used)} are in use. Give the "
                    "checkpoint as a path on the server instead, or start the server with a larger "
                    "INSPECTOR_UPLOAD_LIMIT.")
            for folder in (self.root, self.folder):
                if _private_folder(folder) is None:
                    raise InspectorError(f"upload {base!r} was refused: {folder} cannot be made a private "
                                         "folder of this user (another user or a link holds the name)")
            tmp = path.with_name(path.name + ".part")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            tmp.replace(path)
        return str(confined(path, [self.folder], what="upload"))  # the gate every page path passes

    def close(self) -> None:
        """Remove this session's uploads now."""
        self._finalizer()


def session_uploads() -> UploadStore:
    """This browser session's store (made on first use; its folder goes with the session)."""
    import streamlit as st

    store = st.session_state.get(_SESSION_KEY)
    if not isinstance(store, UploadStore):
        store = st.session_state[_SESSION_KEY] = UploadStore()
    return store
