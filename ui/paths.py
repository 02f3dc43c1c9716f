"""Paths typed into the pages or given in the address, through the one gate
(:func:`inspector.utils.paths.confined`) before anything opens them.

- run files (Training, Compare, Hook captures): under the runs folders or this session's upload
  folder (:func:`ui.runs.checked_path`);
- checkpoints, Hugging Face folders and Compare's B: under the folders of ``INSPECTOR_DATA_DIRS``
  and this session's upload folder when it is set (``serve`` sets it to the runs folders and the
  working directory for a shared server), anywhere the server can read when it is not or is ``*``; a
  path outside is refused with one message whether or not it exists; a FIFO or a device is refused
  either way, before it is opened;
- Python model files: under ``sample_models/`` and ``INSPECTOR_MODEL_DIRS`` (they run as code).
"""

from __future__ import annotations

from pathlib import Path

from inspector.loading import allowed_model_dirs
from inspector.runfolders import ANY_FOLDER, DATA_ENV, data_dirs
from inspector.utils import Kind, confined

__all__ = ["DATA_ENV", "data_dirs", "server_path", "server_source"]


def _refusal(roots: list[Path]):
    def say(text: str) -> str:
        return (f"{text} is not under the data folders ({', '.join(str(r) for r in roots)}): this server "
                f"reads checkpoints and model folders only there or in its upload folder. Upload the file, "
                f"or start the server with that folder in {DATA_ENV} ({DATA_ENV}={ANY_FOLDER}: any folder)")
    return say


def server_path(text: str, kind: Kind = "any", what: str = "checkpoint") -> str:
    """A checkpoint (file or folder) or model folder path, resolved and checked (see the module)."""
    from ui.uploads import session_uploads

    roots = data_dirs()
    return str(confined(text, roots, extra=[session_uploads().folder], kind=kind, what=what,
                        refusal=_refusal(roots or [])))


def server_source(text: str) -> str:
    """A model source as typed (``sample:NAME``, ``FILE.py:factory``, ``hf:DIR``, or a checkpoint
    file or folder) with its path resolved and checked; a sample passes unchanged."""
    text = text.strip()
    if text.startswith("sample:") or not text:
        return text
    if text.startswith("hf:"):
        return "hf:" + server_path(text.removeprefix("hf:"), "folder", "Hugging Face folder")
    if ".py:" in text:
        file = Path(text.rpartition(":")[0].strip()).expanduser()
        allowed = allowed_model_dirs()
        confined(file if file.is_absolute() else Path.cwd() / file, allowed, what="model file",
                 refusal=lambda t: f"{t} is outside the folders model files may be loaded from "
                                   f"({', '.join(str(d) for d in allowed)}). Add its folder to "
                                   "INSPECTOR_MODEL_DIRS.")
        return text  # as typed: load_model checks it again (the same gate) right before importing it
    return server_path(text)
