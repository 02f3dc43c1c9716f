"""Running a user's Python file (a model file or a lab file) as a fresh module.

Model files and lab files are code the user wrote: :func:`import_user_file` is the one place
that runs such a file. It registers the module under a private name (so dataclasses and
pickling inside the file work), takes it out of ``sys.modules`` again when the file raises or
exits, and puts back every process-wide torch setting the file changed
(:func:`inspector.utils.torch_state.restored_torch_state`). What the file raised reaches the caller
unchanged, so each caller words the error for its own user and names the file.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

from ..utils.findings import InspectorError
from ..utils.torch_state import restored_torch_state


def import_user_file(path: Path, prefix: str, changed: list[str] | None = None) -> ModuleType:
    """Run the Python file at ``path`` as a new module named ``<prefix>_<hash of the path>``.

    ``changed`` (if given) receives one line per torch setting the file changed and that was
    put back. Anything the file raises (``SystemExit`` too) propagates after the clean-up.

    >>> import tempfile, torch
    >>> with tempfile.TemporaryDirectory() as d:
    ...     f = Path(d) / "m.py"
    ...     _ = f.write_text("import torch\\ntorch.set_default_dtype(torch.float64)\\nX = 1\\n")
    ...     notes = []
    ...     import_user_file(f, "_doc", notes).X, torch.get_default_dtype(), notes
    (1, torch.float32, ['default dtype: torch.float32 -> torch.float64'])
    """
    mod_name = f"{prefix}_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(mod_name, path)
    if spec is None or spec.loader is None:
        raise InspectorError(f"{path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        with restored_torch_state(changed):
            spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(mod_name, None)
        raise
    return module
