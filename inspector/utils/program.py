"""The program itself: its version, the name the command line runs under (for messages that
tell a user which command to type) and how to install what an optional part needs."""

from __future__ import annotations

import sys
from pathlib import Path

VERSION = "0.1.0"  # pyproject.toml's version; inspector.__version__


def program_name() -> str:
    """``model-inspector`` when run as that script, else ``python -m inspector``."""
    name = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    return name if name.startswith("model-inspector") else "python -m inspector"


# The optional extras of pyproject.toml and what each brings, as pip takes them. ``model-inspector`` on
# the public package index is another project: a hint never says ``pip install 'model-inspector[...]'``.
EXTRAS = {
    "app": ("streamlit>=1.67,<2", "captum>=0.9,<1"),
    "attribution": ("captum>=0.9,<1",),
    "hf": ("transformers>=5.23,<6",),
    "integrations": ("transformers>=5.23,<6", "pytorch-lightning>=2.6,<3", "tensorboard>=2.21,<3"),
}


def install_hint(extra: str) -> str:
    """How to install an optional extra: its packages, or the extra from the source folder.

    >>> install_hint("hf")
    "pip install 'transformers>=5.23,<6' (or, in the model-inspector source folder, pip install '.[hf]')"
    """
    packages = " ".join(f"'{p}'" for p in EXTRAS[extra])
    return f"pip install {packages} (or, in the model-inspector source folder, pip install '.[{extra}]')"
