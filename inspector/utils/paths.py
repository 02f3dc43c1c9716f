"""Paths from people are data: the one gate every path typed into a page, given in an address or named
by a file passes before anything opens it.

* :func:`confined` resolves symlinks and ``..`` first, then refuses a path outside the folders it is
  confined to (when it is), a NUL, and anything that is not what is asked for: a regular file, a
  folder, or either;
* :func:`regular_file` refuses a FIFO, a device or a socket **before** it is opened (opening a FIFO
  blocks until a writer comes; reading ``/dev/zero`` never ends), naming the file;
* :func:`file_kind` says what a path is when it is not a regular file.

Both raise :class:`~inspector.utils.findings.InspectorError` with a message that names the path and
what to give instead.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Literal

from .escaping import visible_text
from .findings import InspectorError

Kind = Literal["file", "folder", "any"]
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"))


def file_kind(path: str | os.PathLike[str]) -> str | None:
    """What ``path`` is when it exists and is not a regular file (``"a FIFO (named pipe)"``, ``"a
    character device"``, ``"a folder"``...); None for a regular file or a path that is not there.
    Symlinks are followed; nothing is opened.

    >>> file_kind("/dev/null")
    'a character device'
    """
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return None
    if stat.S_ISREG(mode):
        return None
    return next((kind for test, kind in _KINDS if test(mode)), "a special file")


def regular_file(path: str | os.PathLike[str], what: str = "file") -> Path:
    """``path`` when it is a regular file (symlinks followed); checked with ``os.stat`` before anything
    opens it, so a FIFO, a device or a socket never blocks or floods the reader.

    Raises:
        InspectorError: it does not exist, or is not a regular file (the message names it and says
            what it is).

    >>> regular_file("/dev/zero", "checkpoint")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    inspector.utils.findings.InspectorError: checkpoint /dev/zero is a character device, not a regular ...
    """
    p = Path(path)
    shown = visible_text(os.fspath(p))
    try:
        mode = os.stat(p).st_mode
    except (OSError, ValueError):
        raise InspectorError(f"{what} {shown} does not exist; give the path of an existing file") from None
    if not stat.S_ISREG(mode):
        kind = file_kind(p) or "not a regular file"
        if kind == "a folder":
            raise InspectorError(f"{what} {shown} is a folder; give the path of a file")
        raise InspectorError(f"{what} {shown} is {kind}, not a regular file; reading it could block or "
                             "never end: give a regular file")
    return p


def _outside(text: str, roots: list[Path]) -> str:
    shown = ", ".join(str(r) for r in roots) or "none is configured"
    return f"{text} is not under the allowed folders ({shown})"


def confined(path: str | os.PathLike[str], roots: Iterable[Path] | None = None, *, extra: Iterable[Path] = (),
             kind: Kind = "file", what: str = "file",
             refusal: Callable[[str], str] | None = None) -> Path:
    """``path`` resolved (symlinks and ``..`` followed), when it is allowed; the one check of every path
    that comes from a person (a page's text field, an address's query, a name in an index).

    Args:
        path: as typed; surrounding blanks are dropped and ``~`` expanded.
        roots: the folders it must lie in after resolving (a relative path is taken inside each in turn,
            the first where it exists); None: any folder the server can read.
        extra: more folders an absolute path may lie in (an upload folder), never searched.
        kind: ``"file"``: a regular file (a FIFO, device or socket is refused before it is opened);
            ``"folder"``; ``"any"``: either.
        what: what the path is, for messages (``"run file"``, ``"checkpoint"``).
        refusal: the message for a path outside ``roots`` (given the path as typed).

    Raises:
        InspectorError: empty, a NUL, outside ``roots`` (the same message whether or not it exists, so
            nothing outside can be probed), missing, or not of ``kind``.
    """
    text = os.fspath(path).strip() if isinstance(path, (str, os.PathLike)) else ""
    shown = visible_text(text)
    bounded = roots is not None
    root_list = [Path(r) for r in roots] if roots is not None else []
    say = refusal or (lambda t: _outside(t, root_list))
    if not text:
        raise InspectorError(say("''") if bounded else f"the {what} path is empty; give a path")
    if "\x00" in text:
        raise InspectorError(say(repr(text)) if bounded else
                             f"{what} {shown} holds a NUL character; no file is named so")
    raw = Path(text).expanduser()
    if not bounded:
        candidates = [raw]
        bases: list[Path] = []
    else:
        candidates = [raw] if raw.is_absolute() else [r / raw for r in root_list]
        bases = [b.resolve() for b in [*root_list, *extra]]
    inside: list[Path] = []
    for c in candidates:
        try:
            resolved = c.resolve()
        except (OSError, RuntimeError, ValueError):  # a symlink loop
            continue
        if bounded and not any(resolved.is_relative_to(b) for b in bases):
            continue
        inside.append(resolved)
        if os.path.lexists(resolved):
            return _of_kind(resolved, shown, kind, what)
    if not inside:
        raise InspectorError(say(text))
    raise InspectorError(f"{what} {shown} does not exist; give the path of an existing "
                         f"{'folder' if kind == 'folder' else 'file'}")


def _of_kind(path: Path, shown: str, kind: Kind, what: str) -> Path:
    if kind == "folder":
        if not path.is_dir():
            raise InspectorError(f"{what} {shown} is not a folder; give a folder")
        return path
    if kind == "any" and path.is_dir():
        return path
    regular_file(path, what)
    return path


__all__ = ["confined", "file_kind", "regular_file"]
