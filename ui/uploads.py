"""Uploaded checkpoints: one folder per browser session, removed when the session ends.

An upload is stored under ``UPLOAD_DIR/<server pid>-<session id>/`` so the loader can read it
by path (only ever with safetensors or ``torch.load(weights_only=True)``). The folder belongs
to an :class:`UploadStore` kept in the session's state: when Streamlit drops the session, the
store is collected and its folder removed. Folders left by a server that is no longer running
(one that was killed) are removed when a server starts (:func:`sweep_once`); folders of other
running servers are left alone. All uploads together may take at most
``INSPECTOR_UPLOAD_LIMIT`` bytes (default 8 GiB, twice the largest single upload the server
accepts); an upload that does not fit is refused, not stored.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
import weakref
from pathlib import Path

from inspector import InspectorError, format_bytes
from inspector.utils import confined

UPLOAD_DIR = Path(tempfile.gettempdir()) / "model-inspector-uploads"
UPLOAD_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin")
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f/\\\\\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
DEFAULT_LIMIT = 8 << 30
_SESSION_KEY = "mi_uploads"
_lock = threading.Lock()
_live: weakref.WeakSet[UploadStore] = weakref.WeakSet()
_swept = False


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


def sweep_stale_uploads(root: Path = UPLOAD_DIR) -> list[Path]:
    """Remove what no live session owns under ``root``: folders of servers that are not
    running, folders of this server whose store is gone, and anything else an hour old.
    Folders of other running servers stay. Returns what was removed.
    """
    owned = {store.folder for store in list(_live)}
    removed = []
    if root.is_dir():
        for entry in root.iterdir():
            pid_text = entry.name.partition("-")[0]
            pid = int(pid_text) if pid_text.isdigit() and entry.is_dir() else None
            if entry in owned or (pid is not None and pid != os.getpid() and _running(pid)):
                continue
            if pid is None:
                try:
                    age = time.time() - entry.stat().st_mtime
                except OSError:  # removed meanwhile (another server's sweep), or a dangling link
                    continue
                if age < 3600:
                    continue  # not a session folder: only removed once it is an hour old
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def sweep_once() -> None:
    """:func:`sweep_stale_uploads` of ``UPLOAD_DIR``, once per server process."""
    global _swept
    with _lock:
        if not _swept:
            sweep_stale_uploads(UPLOAD_DIR)
            _swept = True


class UploadStore:
    """The uploads of one browser session, in a folder of its own removed with the store.

    >>> import tempfile, gc
    >>> store = UploadStore(Path(tempfile.mkdtemp()))
    >>> path = Path(store.save("w.safetensors", b"1234"))
    >>> path.read_bytes(), path.parent == store.folder
    (b'1234', True)
    >>> folder = store.folder; del store; _ = gc.collect()
    >>> folder.exists()
    False
    """

    def __init__(self, root: Path = UPLOAD_DIR, limit: int | None = None) -> None:
        self.root = root
        self.folder = root / f"{os.getpid()}-{uuid.uuid4().hex}"
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
        if self.root == UPLOAD_DIR:
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
            self.folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(path.name + ".part")
            tmp.write_bytes(data)
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
