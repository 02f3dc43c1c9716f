"""Finding labs: the ones shipped in this package and the ones a teacher drops into a folder.

A lab file is a Python file that defines a :class:`~inspector.labs.core.Lab` named ``LAB``
(or a list ``LABS``). Files in the folder named by ``INSPECTOR_LABS_DIR`` are found too; a
file that fails to import, or defines no lab, gives a :class:`LabError` entry for that file
only, and every other lab still loads. A lab file may import helper modules that sit beside it
(``import _helpers``); when any Python file of the folder changes, its lab files run again with
their helpers imported afresh, so an edit shows without a restart.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
import threading
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

from ..loading.user_code import import_user_file
from .core import Lab

LABS_DIR_ENV = "INSPECTOR_LABS_DIR"
_FRAMEWORK = {"core", "discovery", "records"}
_FILE_CACHE: dict[str, tuple[tuple, tuple[Lab | LabError, ...]]] = {}
_LOADING = threading.Lock()  # one lab file at a time: its folder is on sys.path while it runs


@dataclass(frozen=True)
class LabError:
    """A lab that could not be loaded: which file, and why."""

    id: str
    source: str
    message: str
    details: str = ""

    @property
    def title(self) -> str:
        return f"{self.id} (could not be loaded)"


def discover_labs(labs_dir: str | os.PathLike | None = None) -> list[Lab | LabError]:
    """Every lab: the package's own, then those in ``labs_dir`` (default: ``$INSPECTOR_LABS_DIR``).

    Folder files load in name order; files starting with ``_`` are skipped. A lab whose id
    is already taken becomes a LabError; so does a file that raises or defines no lab.

    >>> [lab.id for lab in discover_labs(labs_dir="")][:2]
    ['broken-tie', 'shifted-offsets']
    """
    entries: list[Lab | LabError] = []
    for name in _package_lab_modules():
        try:
            module = importlib.import_module(f"{__package__}.{name}")
        except Exception as exc:  # noqa: BLE001 - one broken lab must not hide the others
            entries.append(_error(name, f"{__package__}.{name}", exc))
            continue
        if hasattr(module, "LAB") or hasattr(module, "LABS"):  # other modules are helpers
            entries.extend(_labs_in(module, f"{__package__}.{name}", name))
    folder = os.environ.get(LABS_DIR_ENV, "") if labs_dir is None else str(labs_dir)
    for part in [p for p in folder.split(os.pathsep) if p.strip()]:
        entries.extend(_folder_labs(Path(part.strip()).expanduser()))
    return _dedupe(entries)


def _package_lab_modules() -> list[str]:
    here = Path(__file__).parent
    names = [m.name for m in pkgutil.iter_modules([str(here)])
             if not m.name.startswith("_") and m.name not in _FRAMEWORK]
    order = ["broken_tie", "shifted_offsets", "stranded_buffer", "corrupted_capture",
             "flattening_myths"]
    return sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n))


def _folder_labs(folder: Path) -> list[Lab | LabError]:
    if not folder.is_dir():
        return [LabError(folder.name or str(folder), str(folder),
                         f"{LABS_DIR_ENV} names {folder}, which is not a folder; "
                         "point it at the folder that holds your lab files")]
    out: list[Lab | LabError] = []
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        out.extend(load_lab_file(path))
    return out


def load_lab_file(path: str | os.PathLike) -> list[Lab | LabError]:
    """The labs one Python file defines, or one LabError saying why there are none.

    A file is run again only when it or a Python file beside it (a helper it may import) changed
    (size or modification time), so the page can look for labs on every rerun and a teacher's
    edit shows up on the next one.
    """
    path = Path(path).resolve()
    try:
        st = path.stat()
        stamp = (st.st_mtime_ns, st.st_size, _folder_stamp(path.parent))
    except OSError as exc:
        return [LabError(path.stem, str(path), f"{path.name} cannot be read: {exc}")]
    cached = _FILE_CACHE.get(str(path))
    if cached is not None and cached[0] == stamp:
        return list(cached[1])
    found = _run_lab_file(path)
    _FILE_CACHE[str(path)] = (stamp, tuple(found))
    return found


def _folder_stamp(folder: Path) -> tuple[tuple[str, int, int], ...]:
    """Name, modification time and size of every Python file in ``folder``."""
    out = []
    for p in sorted(folder.glob("*.py")):
        try:
            st = p.stat()
        except OSError:
            continue
        out.append((p.name, st.st_mtime_ns, st.st_size))
    return tuple(out)


def _run_lab_file(path: Path) -> list[Lab | LabError]:
    """Run a lab file with its folder importable; helpers imported from that folder before are
    forgotten first, so they run again as they are now."""
    folder = str(path.parent)
    with _LOADING:
        for name, mod in list(sys.modules.items()):
            where = getattr(mod, "__file__", None)
            if where and Path(where).resolve().parent == path.parent:
                del sys.modules[name]
        sys.path.insert(0, folder)
        try:
            module = import_user_file(path, f"_inspector_lab_{path.stem}")
        except BaseException as exc:  # noqa: BLE001 - SystemExit in a lab file must not stop the app
            if isinstance(exc, KeyboardInterrupt):
                raise
            return [_error(path.stem, str(path), exc)]
        finally:
            sys.path.remove(folder)
    return _labs_in(module, str(path), path.stem)


def _labs_in(module: ModuleType, source: str, stem: str) -> list[Lab | LabError]:
    found = getattr(module, "LABS", None)
    if found is None:
        found = [module.LAB] if hasattr(module, "LAB") else []
    labs = [lab for lab in found if isinstance(lab, Lab)]
    if not labs or len(labs) != len(found):
        bad = [type(x).__name__ for x in found if not isinstance(x, Lab)]
        why = (f"LAB/LABS holds {', '.join(bad)}, not Lab objects" if bad else
               "it defines no LAB (a Lab object) or LABS (a list of Lab objects)")
        return [LabError(stem, source, f"{Path(source).name}: {why}")]
    return [replace(lab, source=source) for lab in labs]


def _error(stem: str, source: str, exc: BaseException) -> LabError:
    where = Path(source).name if source.endswith(".py") else source
    return LabError(stem, source, f"{where} failed to load: {type(exc).__name__}: {exc}",
                    "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


def _dedupe(entries: list[Lab | LabError]) -> list[Lab | LabError]:
    seen: dict[str, str] = {}
    out: list[Lab | LabError] = []
    for e in entries:
        if isinstance(e, Lab):
            if e.id in seen:
                out.append(LabError(e.id, e.source, f"lab id {e.id!r} in {e.source} is already "
                                    f"used by {seen[e.id]}; give this lab another id"))
                continue
            seen[e.id] = e.source
        out.append(e)
    return out
