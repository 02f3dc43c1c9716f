"""Where the dashboard's scripts are, and the ``streamlit run`` command line that starts them.

From a source checkout the scripts (``app.py``, ``pages/``, ``ui/``) sit next to the
``inspector`` package; an installed wheel puts them in ``<prefix>/share/model-inspector``.
This module only finds files and builds a command line: it never imports streamlit.
"""

from __future__ import annotations

import site
import sys
import sysconfig
import tomllib
from collections.abc import Sequence
from pathlib import Path

from ..utils.findings import InspectorError

SHARE = Path("share") / "model-inspector"


def dashboard_dir() -> Path:
    """The folder holding the dashboard's ``app.py`` (with ``pages/`` and ``ui/`` beside it).

    Raises:
        InspectorError: when no folder holds them (a broken install).
    """
    candidates = [Path(__file__).resolve().parents[2]]
    for base in (sysconfig.get_path("data"), sys.prefix, site.getuserbase()):
        if base:
            candidates.append(Path(base) / SHARE)
    for folder in candidates:
        if (folder / "app.py").is_file() and (folder / "pages").is_dir() and (folder / "ui").is_dir():
            return folder
    raise InspectorError("the dashboard's app.py was not found next to the inspector package nor in "
                         f"{', '.join(str(c) for c in candidates[1:])}; reinstall model-inspector")


def config_options(folder: Path) -> list[str]:
    """``--section.key value`` for every option of ``folder/.streamlit/config.toml`` (none if absent).

    Streamlit reads that file only from the working directory; passing its options on the
    command line makes them hold wherever the dashboard is started from.
    """
    path = folder / ".streamlit" / "config.toml"
    if not path.is_file():
        return []
    options: list[str] = []
    for section, values in tomllib.loads(path.read_text(encoding="utf-8")).items():
        for key, value in values.items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            options += [f"--{section}.{key}", text]
    return options


def streamlit_command(port: int | None = None, extra: Sequence[str] = ()) -> list[str]:
    """The command that serves the dashboard: ``python -m streamlit run <dir>/app.py ...``.

    The project's Streamlit configuration comes first; ``extra`` (streamlit options) is passed
    on after it, and an option given in ``extra`` replaces the configuration's value.

    Args:
        port: ``--server.port``; Streamlit's default (8501) when None.
        extra: more ``streamlit run`` options, e.g. ``["--server.address", "0.0.0.0"]``.
    """
    folder = dashboard_dir()
    given = {word.split("=", 1)[0] for word in extra if word.startswith("--")}
    defaults = config_options(folder)
    options: list[str] = []
    for name, value in zip(defaults[::2], defaults[1::2], strict=True):
        if name not in given:
            options += [name, value]
    if port is not None:
        options += ["--server.port", str(port)]
    return [sys.executable, "-m", "streamlit", "run", str(folder / "app.py"), *options, *extra]
