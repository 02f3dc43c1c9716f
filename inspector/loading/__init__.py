"""Models and checkpoints in: sources to :class:`LoadedModel`, files to state dicts, devices.

Nothing here runs code from a checkpoint (safetensors, or ``torch.load(weights_only=True)``);
Python model files run only from the folders the server allows (:mod:`.user_code`).

- :mod:`.models`: :func:`load_model` (``sample:``, ``FILE.py:factory``, ``hf:``, a checkpoint on top);
- :mod:`.running`: whether a model can run, :func:`to_device`, :func:`call_model`;
- :mod:`.devices`: available devices and a tie-preserving :func:`move_model`;
- :mod:`.checkpoints`, :mod:`.dcp`, :mod:`.listing`: read safetensors, torch and distributed
  checkpoints, and list what one holds without reading its values; :mod:`.folders`: which files of
  a checkpoint folder hold its tensors (through its index); :mod:`.training_state`: a training
  checkpoint's model, optimizer and extra parts; :mod:`.checkpoint_guards`
  checks what an untrusted file claims before anything is allocated;
- :mod:`.hf`, :mod:`.hf_inputs`, :mod:`.hf_saved`, :mod:`.hf_limits`: local Hugging Face folders;
- :mod:`.load_checks`, :mod:`.runcheck`: checks made as a model loads, and whether it runs here.
"""

from __future__ import annotations

from .checkpoints import apply_checkpoint, read_checkpoint
from .dcp import dcp_listing, is_dcp_folder, read_dcp, read_metadata
from .devices import DeviceInfo, available_devices, device_names, move_model, resolve_device
from .folders import FolderFiles, folder_files
from .hf_limits import default_max_bytes
from .listing import checkpoint_listing
from .models import DTYPES, LoadedModel, ModelCodeError, allowed_model_dirs, load_model
from .runcheck import RunCheck, try_forward
from .running import call_model, to_device

__all__ = [
    "DTYPES",
    "DeviceInfo",
    "FolderFiles",
    "LoadedModel",
    "ModelCodeError",
    "RunCheck",
    "allowed_model_dirs",
    "apply_checkpoint",
    "available_devices",
    "call_model",
    "checkpoint_listing",
    "dcp_listing",
    "default_max_bytes",
    "device_names",
    "folder_files",
    "is_dcp_folder",
    "load_model",
    "move_model",
    "read_checkpoint",
    "read_dcp",
    "read_metadata",
    "resolve_device",
    "to_device",
    "try_forward",
]
