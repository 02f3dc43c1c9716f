"""Model sources -> LoadedModel: samples, Python files, local Hugging Face folders, checkpoints."""

from __future__ import annotations

import importlib.util
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..inventory import TensorInventory, tensor_inventory
from ..utils.findings import Finding, InspectorError, first_line
from ..utils.locks import model_lock
from ..utils.paths import confined
from ..utils.program import install_hint
from ..utils.sizes import parse_size
from ..utils.torch_state import restored_torch_state
from ..utils.wrappers import unwrap

# Checkpoint reading lives in checkpoints.py; its names stay importable from here.
from .checkpoints import WRAPPER_PREFIXES as WRAPPER_PREFIXES
from .checkpoints import apply_checkpoint, refuse_remote_code
from .checkpoints import pickle_globals as pickle_globals
from .checkpoints import read_checkpoint as read_checkpoint
from .checkpoints import strip_wrapper_prefix as strip_wrapper_prefix
from .devices import move_model, resolve_device

# Load-time checks live in load_checks.py; their names stay importable from here.
from .load_checks import MAX_DEPTH as MAX_DEPTH
from .load_checks import complex_cast_findings, refuse_deep_nesting

# Running a model (meta checks, inputs to its device, the call) lives in running.py; its names stay
# importable from here.
from .running import call_model as call_model
from .running import ensure_runnable as ensure_runnable
from .running import offloaded_ids as offloaded_ids
from .running import to_device as to_device
from .running import unserved_meta
from .user_code import import_user_file

PROJECT_ROOT = Path(__file__).resolve().parents[2]
SAMPLE_DIR = PROJECT_ROOT / "sample_models"
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


@dataclass
class LoadedModel:
    """A model plus what the inspector knows about it.

    ``findings`` holds what loading found (missing or unexpected keys, ties restored...).
    """

    model: nn.Module
    name: str
    source: str
    device: str = "cpu"
    dtype: str | None = None
    checkpoint: str | None = None
    findings: list[Finding] = field(default_factory=list)
    inputs_fn: Callable[[int], Any] | None = field(default=None, repr=False)
    loss_fn: Callable[[Any, Any], torch.Tensor] | None = field(default=None, repr=False)
    wrappers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """A wrapped model (``torch.compile``, DDP, FSDP) is inspected as the model underneath."""
        unwrapped = unwrap(self.model)
        if unwrapped.wrappers:
            self.model, self.wrappers = unwrapped.module, unwrapped.wrappers
            self.findings = [*unwrapped.findings(), *self.findings]

    @property
    def lock(self) -> threading.RLock:
        """The model's lock: hold it for anything that adds hooks or runs forward/backward."""
        return model_lock(self.model)

    @property
    def is_meta(self) -> bool:
        """Whether some tensor is on the meta device with no weights behind it (tensors that
        accelerate offloaded to the cpu or disk and loads for each forward do not count)."""
        return bool(unserved_meta(tensor_inventory(self.model)))

    @property
    def has_loss(self) -> bool:
        return self.loss_fn is not None

    def example_inputs(self, batch_size: int = 2) -> Any:
        """Example inputs on the model's device, floating tensors in the model's dtype.

        A tensor, a tuple, or a dict of kwargs. Integer inputs (token ids) keep their dtype;
        floating ones (images, features) take the dtype of the model's first floating
        parameter, so a model loaded as float16 gets float16 inputs.
        """
        if self.inputs_fn is None:
            raise InspectorError(f"model {self.name!r} has no example inputs; pass inputs explicitly")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise InspectorError(f"batch size must be a whole number of at least 1, got {batch_size!r}")
        with model_code(
            f"example_inputs({batch_size}) of {self.name}", self._advice("example_inputs(batch_size)")
        ):
            inputs = self.inputs_fn(batch_size)
        inv = tensor_inventory(self.model)
        return to_device(inputs, _input_device(inv), _input_dtype(inv))

    def input_device(self) -> torch.device:
        return _input_device(tensor_inventory(self.model))

    def input_dtype(self) -> torch.dtype | None:
        """The dtype of the first floating parameter (or buffer); None if there is none."""
        return _input_dtype(tensor_inventory(self.model))

    def loss(self, outputs: Any, inputs: Any) -> torch.Tensor:
        if self.loss_fn is None:
            raise InspectorError(f"model {self.name!r} defines no loss; the sample or the file must "
                                 "provide loss(outputs, inputs)")
        with model_code(f"loss(outputs, inputs) of {self.name}", self._advice("loss(outputs, inputs)")):
            return self.loss_fn(outputs, inputs)

    def _advice(self, what: str) -> str:
        if self.source.startswith(
            "hf:"
        ):  # built from the folder's config.json, not from a file of the user's
            return ("a folder's example inputs and loss are built from its config.json: check its sizes and "
                    "token ids, or pass inputs of your own")
        return f"fix {what} in the model file"

    def check_runnable(self) -> None:
        """Raise a clear InspectorError if the model cannot run a forward pass (meta tensors)."""
        ensure_runnable(self.model, self.name)


def _input_device(inv: TensorInventory) -> torch.device:
    """The device of the first parameter (or buffer); the cpu if there is none."""
    return inv.entries[0].device if inv.entries else torch.device("cpu")


def _input_dtype(inv: TensorInventory) -> torch.dtype | None:
    return next((e.dtype for e in inv.entries if e.tensor.is_floating_point()), None)


class ModelCodeError(InspectorError, RuntimeError):
    """The model's own code (its forward, loss, example inputs or factory) raised or exited.

    An ``InspectorError`` (a clear message, exit status 2, no traceback) that is also a
    ``RuntimeError``, so code that catches a failed forward pass as one still does.
    """


@contextmanager
def model_code(what: str, fix: str = "fix the model file, or pick another model",
               changed: list[str] | None = None) -> Iterator[None]:
    """Run the user's model code: any exception (or ``sys.exit``) becomes a ModelCodeError.

    The message names ``what`` ran, the exception, and ``fix``; the original is chained.
    An ``InspectorError`` passes through unchanged; ``KeyboardInterrupt`` too. Process-wide
    torch settings the code changed (default dtype, grad mode...) are put back afterwards and,
    when ``changed`` is given, listed there (:func:`inspector.utils.torch_state.restored_torch_state`).

    >>> with model_code("forward of m"):  # doctest: +NORMALIZE_WHITESPACE
    ...     raise ZeroDivisionError("division by zero")
    Traceback (most recent call last):
    ...
    inspector.loading.models.ModelCodeError: forward of m raised ZeroDivisionError: division by zero;
    fix the model file, or pick another model
    """
    try:
        with restored_torch_state(changed):
            yield
    except InspectorError:
        raise
    except SystemExit as exc:
        raise ModelCodeError(f"{what} called sys.exit({exc.code!r}) instead of returning; {fix}") from None
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
        text = first_line(exc)
        raise ModelCodeError(f"{what} raised {type(exc).__name__}"
                             + (f": {text}" if text else "") + f"; {fix}") from exc


def allowed_model_dirs() -> list[Path]:
    """Folders Python model files may be loaded from: sample_models/ and INSPECTOR_MODEL_DIRS."""
    dirs = [SAMPLE_DIR]
    for part in os.environ.get("INSPECTOR_MODEL_DIRS", "").split(os.pathsep):
        if part.strip():
            dirs.append(Path(part.strip()).expanduser().resolve())
    return dirs


def load_model(
    source: str,
    checkpoint: str | os.PathLike | None = None,
    device: str = "cpu",
    dtype: str | torch.dtype | None = None,
    *,
    max_model_size: int | str | None = None,
) -> LoadedModel:
    """Build a model from ``source``, apply ``checkpoint``, then move it to ``device``/``dtype``.

    Args:
        source: ``"sample:<name>"``, ``"path/to/file.py:factory"`` (from an allowed folder) or
            ``"hf:<local model directory>"``.
        checkpoint: optional ``.safetensors`` or ``.pt/.pth/.bin`` (``weights_only=True``).
        device: ``"cpu"``, ``"cuda:N"``, ``"mps"`` or ``"meta"``.
        dtype: a floating dtype or its name (``"float16"``...), or None to keep the model's.
            Complex tensors stay complex (complex32/64/128), with a finding.
        max_model_size: the largest Hugging Face model built (bytes or ``"20GiB"``), estimated
            on the meta device from its config before anything is allocated; None: the server's
            ``INSPECTOR_MAX_MODEL_SIZE``, else half of this machine's memory. A folder cannot raise it.

    Raises:
        InspectorError: with a message naming the source, file, tensor or device at fault.

    >>> loaded = load_model("sample:tiny-gpt2")
    >>> sum(p.numel() for p in loaded.model.parameters())
    4080
    """
    if not isinstance(source, str) or not source.strip():
        raise InspectorError(f"source must be a non-empty string such as 'sample:tiny-gpt2', "
                             f"'path/to/file.py:factory' or 'hf:<local model directory>', got {source!r}")
    if checkpoint is not None and not isinstance(checkpoint, (str, os.PathLike)):
        raise InspectorError(f"checkpoint must be a path to a .safetensors or .pt/.pth/.bin file (or None), "
                             f"got {type(checkpoint).__name__}")
    dev = resolve_device(device)
    torch_dtype = parse_dtype(dtype)
    limit = None if max_model_size is None else parse_size(max_model_size, "max_model_size")
    loaded = _build(source, limit)
    refuse_deep_nesting(loaded.model, loaded.name)
    if checkpoint is not None:
        loaded.findings += apply_checkpoint(loaded.model, checkpoint)
        loaded.checkpoint = str(checkpoint)
    if loaded.is_meta and dev.type != "meta":
        raise InspectorError(
            f"{loaded.name} is built on the meta device (structure only, no weights), so it cannot "
            f"be placed on {dev}. Choose the device 'meta', or give a checkpoint with its weights.")
    loaded.findings += complex_cast_findings(loaded.model, torch_dtype)
    if offloaded_ids(loaded.model):  # dispatched by accelerate with offloading: its hooks place the tensors
        loaded.findings.append(
            Finding(
                "accelerate-offloaded",
                "info",
                "",
                f"{loaded.name} was dispatched by accelerate with weights offloaded to the cpu or disk; "
                f"it stays where accelerate put it (not moved to {dev}), and its hooks load the offloaded "
                "weights for each forward pass. Their gradients are not kept: accelerate drops the loaded "
                "copy after the forward",
            )
        )
    else:
        move_model(loaded.model, dev, torch_dtype)
    loaded.device = str(dev)
    loaded.dtype = None if torch_dtype is None else str(torch_dtype).removeprefix("torch.")
    return loaded


def parse_dtype(dtype: str | torch.dtype | None) -> torch.dtype | None:
    """A floating-point torch dtype from itself or its name; None stays None.

    >>> parse_dtype("float16"), parse_dtype(None)
    (torch.float16, None)
    """
    if dtype is None:
        return None
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise InspectorError(f"dtype {dtype} is not a floating-point dtype a model can be cast to; "
                                 f"choose one of {', '.join(DTYPES)}")
        return dtype
    key = str(dtype).removeprefix("torch.") if isinstance(dtype, str) else None
    if key not in DTYPES:
        raise InspectorError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[key]


#: Deepest nesting of modules accepted: torch walks modules recursively, so deeper models fail everywhere.
def _build(source: str, max_bytes: int | None = None) -> LoadedModel:
    if source.startswith("sample:"):
        return _build_sample(source.removeprefix("sample:"))
    if source.startswith("hf:"):
        return _build_hf(source.removeprefix("hf:"), max_bytes)
    if ".py:" in source:
        return _build_file(source)
    if source.endswith(".py"):
        raise InspectorError(
            f"{source!r} names a Python file but no factory: add ':' and the function or class "
            f"in it that returns the model, e.g. '{source}:build'"
        )
    raise InspectorError(f"cannot tell what kind of source {source!r} is: use 'sample:<name>', "
                         "'path/to/file.py:factory' or 'hf:<local model directory>'")


def _build_sample(name: str) -> LoadedModel:
    from sample_models import SAMPLES

    if name not in SAMPLES:
        raise InspectorError(f"unknown sample {name!r}; known samples: {', '.join(SAMPLES)}")
    s = SAMPLES[name]
    return LoadedModel(s.build(), name, f"sample:{name}", inputs_fn=s.example_inputs,
                       loss_fn=s.loss if s.loss_fn is not None else None)


def _build_file(source: str) -> LoadedModel:
    path_str, _, factory = source.rpartition(":")
    path = Path(path_str.strip()).expanduser()
    if not path.is_absolute():
        path = (Path.cwd() / path)
    allowed = allowed_model_dirs()
    path = confined(path, allowed, what="model file", refusal=lambda text: (
        f"{Path(text).resolve()} is outside the folders model files may be loaded from "
        f"({', '.join(str(d) for d in allowed)}). Add its folder to INSPECTOR_MODEL_DIRS."))
    changed: list[str] = []
    with model_code(f"importing {path}", "fix the file", changed):
        module = import_user_file(path, "_inspector_user", changed)
    fn = getattr(module, factory, None)
    if not callable(fn):
        names = [n for n in dir(module) if callable(getattr(module, n)) and not n.startswith("_")]
        raise InspectorError(f"{path} has no callable {factory!r}; callables there: {', '.join(names)}")
    with model_code(f"{path.name}:{factory}()", "make the factory return an nn.Module", changed):
        model = fn()
    if not isinstance(model, nn.Module):
        raise InspectorError(
            f"{path.name}:{factory}() returned {type(model).__name__}, not a torch nn.Module"
        )
    inputs_fn = getattr(module, "example_inputs", None)
    loss_fn = getattr(module, "loss", None)
    findings = [
        Finding(
            "torch-state-restored",
            "warning",
            path.name,
            f"{path.name} changed a process-wide torch setting ({c}) while loading; it was put back, "
            "so it does not affect other models. Set it inside the model instead",
        )
        for c in changed
    ]
    return LoadedModel(model, f"{path.stem}:{factory}", source, findings=findings,
                       inputs_fn=inputs_fn if callable(inputs_fn) else None,
                       loss_fn=loss_fn if callable(loss_fn) else None)


def _build_hf(directory: str, max_bytes: int | None = None) -> LoadedModel:
    path = Path(directory).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise InspectorError(f"{path} is not a Hugging Face model folder (no config.json there)")
    refuse_remote_code(path)
    if importlib.util.find_spec("transformers") is None:
        raise InspectorError(f"loading the Hugging Face folder {path} needs transformers: "
                             + install_hint("hf"))
    from . import hf

    model, findings = hf.load_hf_folder(path, max_bytes)
    return LoadedModel(model, path.name, f"hf:{path}", findings=findings,
                       inputs_fn=hf.example_inputs_for(model), loss_fn=hf.loss_for(model))
