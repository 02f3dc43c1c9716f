"""The program itself: its version, and the name the command line runs under (for messages that
tell a user which command to type)."""

from __future__ import annotations

import sys
from pathlib import Path

VERSION = "0.1.0"  # pyproject.toml's version; inspector.__version__


def program_name() -> str:
    """``model-inspector`` when run as that script, else ``python -m inspector``."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith("model-inspector") else "python -m inspector"
