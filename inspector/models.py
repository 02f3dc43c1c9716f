"""Model sources -> LoadedModel: samples, Python files, local Hugging Face folders, checkpoints."""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map_only

from .devices import move_model, resolve_device
from .findings import Finding, InspectorError, first_line
from .locks import model_lock
from .wrappers import unwrap

PROJECT_ROOT = Path(__file__).resolve().parent.parent
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
        return any(t.device.type == "meta" for t in _tensors(self.model))

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
        with model_code(f"example_inputs({batch_size}) of {self.name}",
                        "fix example_inputs(batch_size) in the model file"):
            inputs = self.inputs_fn(batch_size)
        return to_device(inputs, self.input_device(), self.input_dtype())

    def input_device(self) -> torch.device:
        for t in _tensors(self.model):
            return t.device
        return torch.device("cpu")

    def input_dtype(self) -> torch.dtype | None:
        """The dtype of the first floating parameter (or buffer); None if there is none."""
        for t in _tensors(self.model):
            if t.is_floating_point():
                return t.dtype
        return None

    def loss(self, outputs: Any, inputs: Any) -> torch.Tensor:
        if self.loss_fn is None:
            raise InspectorError(f"model {self.name!r} defines no loss; the sample or the file must "
                                 "provide loss(outputs, inputs)")
        with model_code(f"loss(outputs, inputs) of {self.name}", "fix loss(outputs, inputs) in the model file"):
            return self.loss_fn(outputs, inputs)

    def check_runnable(self) -> None:
        """Raise a clear InspectorError if the model cannot run a forward pass (meta tensors)."""
        ensure_runnable(self.model, self.name)


def _tensors(model: nn.Module):
    yield from model.parameters()
    yield from model.buffers()


def ensure_runnable(model: nn.Module, name: str = "model") -> None:
    """Refuse a forward pass on a model whose tensors are on the meta device."""
    meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if meta:
        raise InspectorError(
            f"{name} is on the meta device ({len(meta)} tensors, first {meta[0]}): it has a structure "
            "but no numbers, so it cannot run a forward pass. Structure views (aliases, offsets, "
            "device maps) work; load it with a checkpoint on a real device to run it.")


class ModelCodeError(InspectorError, RuntimeError):
    """The model's own code (its forward, loss, example inputs or factory) raised or exited.

    An ``InspectorError`` (a clear message, exit status 2, no traceback) that is also a
    ``RuntimeError``, so code that catches a failed forward pass as one still does.
    """


@contextmanager
def model_code(what: str, fix: str = "fix the model file, or pick another model") -> Iterator[None]:
    """Run the user's model code: any exception (or ``sys.exit``) becomes a ModelCodeError.

    The message names ``what`` ran, the exception, and ``fix``; the original is chained.
    An ``InspectorError`` passes through unchanged; ``KeyboardInterrupt`` too.

    >>> with model_code("forward of m"):
    ...     raise ZeroDivisionError("division by zero")
    Traceback (most recent call last):
    ...
    inspector.models.ModelCodeError: forward of m raised ZeroDivisionError: division by zero; fix the model file, or pick another model
    """
    try:
        yield
    except InspectorError:
        raise
    except SystemExit as exc:
        raise ModelCodeError(f"{what} called sys.exit({exc.code!r}) instead of returning; {fix}") from None
    except Exception as exc:  # noqa: BLE001 - the user's code may raise anything
        text = first_line(exc)
        raise ModelCodeError(f"{what} raised {type(exc).__name__}"
                             + (f": {text}" if text else "") + f"; {fix}") from exc


def to_device(inputs: Any, device: torch.device, dtype: torch.dtype | None = None) -> Any:
    """Move a tensor, or every tensor inside a pytree (tuples, lists, dicts, named tuples), to ``device``.

    With ``dtype``, floating tensors are cast to it too (integer and bool tensors keep theirs).
    Anything that is not a tensor is returned as it is.

    >>> to_device((torch.ones(1), torch.ones(1, dtype=torch.long)), torch.device("cpu"),
    ...           torch.float16)[0].dtype
    torch.float16
    """
    def move(t: torch.Tensor) -> torch.Tensor:
        cast = dtype is not None and t.is_floating_point()
        return t.to(device=device, dtype=dtype if cast else t.dtype)

    return tree_map_only(torch.Tensor, move, inputs)


def call_model(model: nn.Module, inputs: Any) -> Any:
    """``model(inputs)`` for a tensor, ``model(*inputs)`` for a tuple, ``model(**inputs)`` for a dict."""
    if isinstance(inputs, dict):
        return model(**inputs)
    if isinstance(inputs, (tuple, list)):
        return model(*inputs)
    return model(inputs)


def allowed_model_dirs() -> list[Path]:
    """Folders Python model files may be loaded from: sample_models/ and INSPECTOR_MODEL_DIRS."""
    dirs = [SAMPLE_DIR]
    for part in os.environ.get("INSPECTOR_MODEL_DIRS", "").split(os.pathsep):
        if part.strip():
            dirs.append(Path(part.strip()).expanduser().resolve())
    return dirs


def load_model(source: str, checkpoint: str | os.PathLike | None = None, device: str = "cpu",
               dtype: str | torch.dtype | None = None) -> LoadedModel:
    """Build a model from ``source``, apply ``checkpoint``, then move it to ``device``/``dtype``.

    Args:
        source: ``"sample:<name>"``, ``"path/to/file.py:factory"`` (from an allowed folder) or
            ``"hf:<local model directory>"``.
        checkpoint: optional ``.safetensors`` or ``.pt/.pth/.bin`` (``weights_only=True``).
        device: ``"cpu"``, ``"cuda:N"``, ``"mps"`` or ``"meta"``.
        dtype: a floating dtype or its name (``"float16"``...), or None to keep the model's.

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
    loaded = _build(source)
    if checkpoint is not None:
        loaded.findings += apply_checkpoint(loaded.model, checkpoint)
        loaded.checkpoint = str(checkpoint)
    if loaded.is_meta and dev.type != "meta":
        raise InspectorError(
            f"{loaded.name} is built on the meta device (structure only, no weights), so it cannot "
            f"be placed on {dev}. Choose the device 'meta', or give a checkpoint with its weights.")
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


def _build(source: str) -> LoadedModel:
    if source.startswith("sample:"):
        return _build_sample(source.removeprefix("sample:"))
    if source.startswith("hf:"):
        return _build_hf(source.removeprefix("hf:"))
    if ".py:" in source:
        return _build_file(source)
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
    path = Path(path_str).expanduser()
    if not path.is_absolute():
        path = (Path.cwd() / path)
    path = path.resolve()
    allowed = allowed_model_dirs()
    if not any(path.is_relative_to(d) for d in allowed):
        raise InspectorError(
            f"{path} is outside the folders model files may be loaded from "
            f"({', '.join(str(d) for d in allowed)}). Add its folder to INSPECTOR_MODEL_DIRS.")
    if not path.is_file():
        raise InspectorError(f"model file {path} does not exist")
    mod_name = f"_inspector_user_{abs(hash(str(path)))}"
    try:
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise InspectorError(f"model file {path} cannot be imported as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        with model_code(f"importing {path}", "fix the file"):
            spec.loader.exec_module(module)
    except InspectorError:
        sys.modules.pop(mod_name, None)
        raise
    fn = getattr(module, factory, None)
    if not callable(fn):
        names = [n for n in dir(module) if callable(getattr(module, n)) and not n.startswith("_")]
        raise InspectorError(f"{path} has no callable {factory!r}; callables there: {', '.join(names)}")
    with model_code(f"{path.name}:{factory}()", "make the factory return an nn.Module"):
        model = fn()
    if not isinstance(model, nn.Module):
        raise InspectorError(f"{path.name}:{factory}() returned {type(model).__name__}, not a torch nn.Module")
    inputs_fn = getattr(module, "example_inputs", None)
    loss_fn = getattr(module, "loss", None)
    return LoadedModel(model, f"{path.stem}:{factory}", source,
                       inputs_fn=inputs_fn if callable(inputs_fn) else None,
                       loss_fn=loss_fn if callable(loss_fn) else None)


def _build_hf(directory: str) -> LoadedModel:
    path = Path(directory).expanduser().resolve()
    if not (path / "config.json").is_file():
        raise InspectorError(f"{path} is not a Hugging Face model folder (no config.json there)")
    refuse_remote_code(path)
    if importlib.util.find_spec("transformers") is None:
        raise InspectorError(f"loading the Hugging Face folder {path} needs transformers: "
                             "pip install 'model-inspector[hf]'")
    from . import hf

    model, findings = hf.load_hf_folder(path)
    return LoadedModel(model, path.name, f"hf:{path}", findings=findings,
                       inputs_fn=hf.example_inputs_for(model), loss_fn=hf.loss_for(model))


def refuse_remote_code(path: Path) -> None:
    """Refuse a Hugging Face folder whose config asks transformers to run Python from the folder.

    ``auto_map`` in ``config.json`` names classes in the folder's own ``.py`` files; loading
    them would run that code. The file is read as JSON only; nothing from it runs.
    """
    import json

    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InspectorError(f"{config_file} is not readable JSON ({type(exc).__name__}: {exc}); "
                             "fix or replace the folder's config.json") from None
    if not isinstance(config, dict):
        raise InspectorError(f"{config_file} does not hold a JSON object; fix or replace it")
    if "auto_map" in config:
        names = config["auto_map"]
        shown = ", ".join(map(str, names.values())) if isinstance(names, dict) else str(names)
        raise InspectorError(
            f"{path} was refused: its config.json has auto_map ({shown[:200]}), so loading it would run "
            "Python code from the folder, and the inspector never runs code from a model folder. "
            "Load a model whose architecture ships with transformers, or write a model file "
            "(file.py:factory) in a folder listed in INSPECTOR_MODEL_DIRS.")


def read_checkpoint(path: str | os.PathLike, *, mmap: bool = False) -> tuple[dict[str, torch.Tensor], list[Finding]]:
    """A state dict from a ``.safetensors`` or ``.pt/.pth/.bin`` file, or a ``torch.distributed.checkpoint``
    folder; never runs code from it. ``mmap``: a torch zip file's tensors stay on disk until read."""
    path = Path(path)
    findings: list[Finding] = []
    if path.is_dir():  # a torch.distributed.checkpoint folder, put together in this process
        from .distributed.checkpoint import read_dcp
        return read_dcp(path)
    if not path.is_file():
        raise InspectorError(f"checkpoint {path} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        try:
            return load_file(str(path)), findings
        except Exception as exc:
            raise InspectorError(f"checkpoint {path.name} is not a readable safetensors file "
                                 f"({type(exc).__name__}: {exc}); re-save it with safetensors") from exc
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and zipfile.is_zipfile(path))
    except pickle.UnpicklingError as exc:
        detail = re.search(r"WeightsUnpickler error:\s*(.+?)(?:\.\s|\n|$)", str(exc))
        detail_text = detail.group(1).strip() if detail else ""
        calls = pickle_globals(path)
        if calls or "global" in detail_text.lower():
            named = f" ({', '.join(calls[:3])})" if calls else f" ({detail_text})"
            raise InspectorError(
                f"checkpoint {path.name} was refused: it asks to run Python code while loading"
                f"{named}. Only plain tensors are accepted and nothing in it was run. "
                "If you trust it, re-save its state dict with safetensors.") from None
        raise InspectorError(f"checkpoint {path.name} is corrupt or not a torch file "
                             f"({detail_text or 'unreadable pickle'})") from None
    except Exception as exc:  # noqa: BLE001 - any other failure means the file is not a torch file
        calls = pickle_globals(path)
        if calls:
            raise InspectorError(
                f"checkpoint {path.name} was refused: it asks to run Python code while loading "
                f"({', '.join(calls[:3])}). Only plain tensors are accepted and nothing in it was run. "
                "If you trust it, re-save its state dict with safetensors.") from None
        first = first_line(exc)
        raise InspectorError(f"checkpoint {path.name} is corrupt or not a torch file "
                             f"({type(exc).__name__}{': ' + first[:200] if first else ''}); give a "
                             ".safetensors file or one written by torch.save(model.state_dict(), path)") from None
    if isinstance(obj, dict):
        for key in ("state_dict", "model_state_dict", "model"):
            inner = obj.get(key)
            if isinstance(inner, dict) and inner and all(isinstance(v, torch.Tensor) for v in inner.values()):
                findings.append(Finding("checkpoint-nested", "info", str(path.name),
                                        f"used the state dict under key {key!r} of {path.name}"))
                obj = inner
                break
    if not isinstance(obj, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                            for k, v in obj.items()):
        raise InspectorError(f"checkpoint {path.name} is not a state dict (a dict of names to tensors); "
                             f"it holds {type(obj).__name__}")
    return obj, findings


def pickle_globals(path: Path) -> list[str]:
    """Callables outside torch's own that a checkpoint's pickle names; nothing in it is executed.

    A torch zip file is read by ``torch.serialization.get_unsafe_globals_in_checkpoint``
    (everything outside torch's ``weights_only`` allowlist). That function refuses bare and
    legacy pickles, and torch's error for them names no callable, so those are read with
    ``pickletools.genops``, which parses opcodes of every protocol and executes nothing.
    """
    try:
        if zipfile.is_zipfile(path):
            return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        data = path.read_bytes()
    except Exception:  # noqa: BLE001 - an unreadable file names nothing
        return []
    return _bare_pickle_globals(data)


_TORCH_GLOBALS = ("torch.", "collections.OrderedDict", "builtins.set", "_codecs.encode")


def _bare_pickle_globals(data: bytes) -> list[str]:
    """The globals named by the pickles at the start of ``data``, minus torch's own, in file order."""
    import io
    import pickletools

    found: list[str] = []
    strings: list[str] = []
    stream = io.BytesIO(data)
    # A legacy torch file is several pickles in a row (magic number, protocol, system info,
    # the object), then raw storage bytes: read pickle after pickle until one does not parse.
    while stream.tell() < len(data):
        try:
            for op, arg, _ in pickletools.genops(stream):
                if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
                    strings.append(str(arg))
                elif op.name == "GLOBAL":
                    found.append(str(arg).replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(f"{strings[-2]}.{strings[-1]}")
        except Exception:  # noqa: BLE001 - past the last pickle (or a broken one): stop reading
            break
    return [g for g in dict.fromkeys(found) if not g.startswith(_TORCH_GLOBALS)]


WRAPPER_PREFIXES = ("_orig_mod.", "module.")


def strip_wrapper_prefix(state: dict[str, torch.Tensor], own: dict[str, Any]) -> tuple[dict[str, torch.Tensor], str]:
    """``state`` without the ``_orig_mod.`` / ``module.`` prefixes a wrapped model writes, when
    every key has them and the model's names do not; returns the prefix stripped ("" for none).

    >>> strip_wrapper_prefix({"_orig_mod.module.w": 1}, {"w": 0})
    ({'w': 1}, '_orig_mod.module.')
    """
    stripped = ""
    while state and not any(k in own for k in state):
        prefix = next((p for p in WRAPPER_PREFIXES if all(k.startswith(p) for k in state)), None)
        if prefix is None:
            break
        state = {k[len(prefix):]: v for k, v in state.items()}
        stripped += prefix
    return state, stripped


def apply_checkpoint(model: nn.Module, path: str | os.PathLike) -> list[Finding]:
    """Copy a checkpoint into ``model`` in place, keeping its ties; findings say what happened.

    Missing and unexpected keys become warnings. A key missing only because its tie partner
    is present (a tied model saved by safetensors keeps one name) is filled through the tie.
    A shape mismatch raises before anything is copied, so the model is unchanged.
    """
    state, findings = read_checkpoint(path)
    name = Path(path).name
    own = model.state_dict(keep_vars=True)
    state, stripped = strip_wrapper_prefix(state, own)
    if stripped:
        findings.append(Finding("checkpoint-wrapped", "info", name,
                                f"{name} was saved from a wrapped model (names start with {stripped!r}, "
                                "as torch.compile or DDP write them); the names were read without it"))
    by_id: dict[int, list[str]] = {}
    for key, t in own.items():
        by_id.setdefault(id(t), []).append(key)
    for key, t in state.items():
        if key in own and tuple(own[key].shape) != tuple(t.shape):
            raise InspectorError(f"checkpoint {name}: tensor {key} has shape {tuple(t.shape)} but the "
                                 f"model expects {tuple(own[key].shape)}; nothing was loaded")
    missing: list[tuple[str, list[str]]] = []
    restored: list[tuple[str, list[str]]] = []
    for key, t in own.items():
        if key in state:
            continue
        partners = [k for k in by_id[id(t)] if k in state]
        (restored if partners else missing).append((key, partners))
    unexpected = [k for k in state if k not in own]
    for key, partners in restored:
        findings.append(Finding("tie-restored", "info", key,
                                f"{key} is not in {name}; it is tied to {partners[0]}, which is, so it "
                                "shares that value"))
    for key, _ in missing:
        findings.append(Finding("missing-key", "warning", key,
                                f"{key} is not in {name}; it keeps its initial value"))
    for key in unexpected:
        findings.append(Finding("unexpected-key", "warning", key,
                                f"{key} is in {name} but the model has no such tensor; it was ignored"))
    findings += _dtype_findings(own, state, name)
    for keys in by_id.values():
        present = [k for k in keys if k in state]
        if len(present) > 1 and any(not torch.equal(state[present[0]], state[k]) for k in present[1:]):
            findings.append(Finding("tie-conflict", "warning", present[0],
                                    f"{name} holds different values for the tied names "
                                    f"{', '.join(present)}; the model keeps one tensor, with the "
                                    f"value of {present[-1]}"))
    with torch.no_grad():
        model.load_state_dict(state, strict=False)
    return findings


def _kind(dtype: torch.dtype) -> str:
    return ("bool" if dtype == torch.bool else "complex" if dtype.is_complex else
            "floating-point" if dtype.is_floating_point else "integer")


def _dtype_findings(own: dict[str, torch.Tensor], state: dict[str, torch.Tensor], name: str) -> list[Finding]:
    """A warning for each checkpoint tensor whose kind (integer, floating...) differs from the
    model's tensor it is copied into, an info for each other dtype change; the copy casts."""
    out = []
    for key, t in state.items():
        mine = own.get(key)
        if mine is None or mine.dtype == t.dtype:
            continue
        have, got = str(mine.dtype).removeprefix("torch."), str(t.dtype).removeprefix("torch.")
        if _kind(mine.dtype) != _kind(t.dtype):
            out.append(Finding("dtype-mismatch", "warning", key,
                               f"{name} holds {key} as {got} ({_kind(t.dtype)}) but the model's tensor is "
                               f"{have}; the values were cast to {have}. Check that the checkpoint "
                               "belongs to this model, or re-save it with the right dtype"))
        else:
            out.append(Finding("dtype-cast", "info", key,
                               f"{name} holds {key} as {got}; it was cast to the model's {have}"))
    return out
