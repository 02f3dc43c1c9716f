"""What a Hugging Face folder may ask for before anything is built: no config field that fetches or
runs code, files inside the folder only, and a model no larger than a limit the user (never the
folder) sets.

The size is estimated on the meta device, which allocates nothing, from copies of the config
with one and two layers per layer-count field, extrapolated linearly; so a config that claims a
million layers costs a few small builds, not a million layers.
"""

from __future__ import annotations

import copy
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..utils.findings import InspectorError
from ..utils.paths import file_kind

#: Config fields that count repeated layers (read through ``config.to_dict()``, sub-configs too).
LAYER_FIELDS = frozenset({"num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_encoder_layers",
                          "num_decoder_layers", "encoder_layers", "decoder_layers", "num_local_layers",
                          "num_global_layers"})
#: Most modules a folder may ask for (``INSPECTOR_MAX_MODULES`` overrides): building one takes time.
MAX_MODULES = 200_000
#: A config whose layers cannot be counted down is built whole on the meta device only up to this many layers.
MAX_UNESTIMATED_LAYERS = 1_000
INDEX_FILES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


#: config.json fields that name an implementation transformers looks up by name. Values other than
#: those below make it fetch and run a kernel from the Hub: a repository (``org/repo@rev:fn``), the
#: experts kernels ``deepgemm`` and ``sonicmoe``, and flash attention where the flash_attn package is
#: missing (transformers then falls back to a Hub kernel).
IMPLEMENTATION_FIELDS = (
    "attn_implementation",
    "_attn_implementation",
    "_attn_implementation_internal",
    "experts_implementation",
    "_experts_implementation",
    "_experts_implementation_internal",
)
LOCAL_IMPLEMENTATIONS = frozenset({"eager", "sdpa", "flex_attention", "batched_mm", "grouped_mm"})


def _local_implementation(value: Any) -> bool:
    """Whether an implementation name runs code of torch or transformers only (never a Hub kernel)."""
    if value is None:
        return True
    if not isinstance(value, str):
        return False
    name = value.removeprefix("paged|")
    if name.startswith("flash_attention_") and name[len("flash_attention_"):].isdigit():
        import importlib.util

        return importlib.util.find_spec("flash_attn") is not None
    return name in LOCAL_IMPLEMENTATIONS
#: quantization methods whose transformers integration fetches kernels (code) from the Hub.
KERNEL_QUANT_METHODS = frozenset({"eetq", "fbgemm_fp8", "fp8", "gguf", "metal", "mxfp4", "nvfp4"})


def code_fields(config: Any, where: str = "") -> list[str]:
    """The fields of a config (and of its sub-configs, at any depth) that would make transformers
    fetch or run code: ``auto_map``, an implementation that is a Hub kernel, a quantization method
    that loads Hub kernels. Each as ``path: value``.

    >>> code_fields({"text_config": {"_attn_implementation": "org/kernel"}, "auto_map": {"AutoModel": "m.M"}})
    ["auto_map: {'AutoModel': 'm.M'}", 'text_config._attn_implementation: org/kernel']
    """
    found: list[str] = []
    stack: list[tuple[str, Any]] = [(where, config)]
    while stack:
        prefix, node = stack.pop()
        if isinstance(node, list):
            stack.extend((f"{prefix}[{i}]", v) for i, v in enumerate(node))
            continue
        if not isinstance(node, dict):
            continue
        for key, value in node.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if key == "auto_map" or key == "custom_pipelines":
                found.append(f"{name}: {value}")
            elif key in IMPLEMENTATION_FIELDS and value is not None:
                values = value.values() if isinstance(value, dict) else [value]
                if not all(_local_implementation(v) for v in values):
                    found.append(f"{name}: {value}")
            elif key == "quantization_config" and isinstance(value, dict) and \
                    str(value.get("quant_method", "")).lower() in KERNEL_QUANT_METHODS:
                found.append(f"{name}.quant_method: {value.get('quant_method')}")
            else:
                stack.append((name, value))
    return sorted(found)


def refuse_code_fields(config: Any, path: Path) -> None:
    """Raise naming every field of ``config`` (from ``path``'s config.json) that would fetch or run code.

    >>> refuse_code_fields({"_attn_implementation": "sdpa",
    ...                     "text_config": {"experts_implementation": "eager"}}, Path("m"))
    """
    fields = code_fields(config)
    if not fields:
        return
    shown = "; ".join(fields)[:300]
    if any(f.split(":")[0].rsplit(".", 1)[-1] in ("auto_map", "custom_pipelines") for f in fields):
        why = "loading it would run Python code from the folder"
    else:
        why = "loading it would make transformers fetch and run kernel code from the Hugging Face Hub"
    raise InspectorError(
        f"{path} was refused: its config.json has {shown}, so {why}, and the inspector never runs code "
        "from a model folder. Remove those fields (or set the implementation to eager or sdpa), load a "
        "model whose architecture ships with transformers, or write a model file (file.py:factory) in a "
        "folder listed in INSPECTOR_MODEL_DIRS.")


def saved_architectures(config: Any) -> list[str]:
    """The class names in ``config.architectures`` (one name given as a string counts as one).

    >>> from types import SimpleNamespace as NS
    >>> saved_architectures(NS(architectures="GPT2LMHeadModel")), saved_architectures(NS(architectures=None))
    (['GPT2LMHeadModel'], [])
    """
    names = getattr(config, "architectures", None) or []
    if isinstance(names, str):
        names = [names]
    return [a for a in names if isinstance(a, str)] if isinstance(names, (list, tuple)) else []


def check_index_paths(folder: Path) -> None:
    """Refuse a folder whose weight index names a file outside it (``../x``, an absolute path, a
    link that leads out): transformers would load those weights."""
    root = folder.resolve()
    for index_name in INDEX_FILES:
        index = folder / index_name
        if not index.is_file():
            continue
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = set(weight_map.values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise InspectorError(f"{index} is not a readable shard index ({type(exc).__name__}: {exc}); "
                                 "fix or remove it") from None
        for name in sorted(map(str, files)):
            target = (folder / name).resolve()
            if Path(name).is_absolute() or not target.is_relative_to(root):
                raise InspectorError(
                    f"{folder} was refused: {index_name} names the weight file {name!r}, which lies outside "
                    "the folder; every file an index names must be inside the model folder. Copy the shards "
                    "into the folder and list them by file name.")
            special = file_kind(target)
            if special:  # transformers would block in a FIFO or read a device without end
                raise InspectorError(f"{folder} was refused: {index_name} names the weight file {name!r}, "
                                     f"which is {special}, not a regular file")


def check_folder_files(folder: Path) -> None:
    """Before transformers reads anything: every file an index names lies inside the folder, and
    no torch weight file there declares more bytes than it could hold (a zip bomb)."""
    from .checkpoint_guards import check_zip_sizes

    check_index_paths(folder)
    for file in sorted(folder.iterdir()):
        if file.suffix in (".bin", ".pt", ".pth") and file.is_file():
            check_zip_sizes(file, f"{folder.name}/{file.name}")


@dataclass(frozen=True)
class SizeEstimate:
    """Bytes of parameters and buffers and the number of modules a config builds (estimated)."""

    nbytes: int
    modules: int


def default_max_bytes() -> int:
    """The largest model built unless the user says otherwise: ``INSPECTOR_MAX_MODEL_SIZE``, else
    half of this machine's memory."""
    raw = os.environ.get("INSPECTOR_MAX_MODEL_SIZE", "").strip()
    if raw:
        from ..utils.sizes import parse_size

        return parse_size(raw, "INSPECTOR_MAX_MODEL_SIZE")
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 16 << 30


def max_modules() -> int:
    raw = os.environ.get("INSPECTOR_MAX_MODULES", "").strip()
    return int(raw) if raw.isdigit() else MAX_MODULES


def _layer_fields(config: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], str, int]]:
    """(path to the sub-config, field, count) for every layer-count field, sub-configs included."""
    out = []
    for key, value in config.to_dict().items():
        if key in LAYER_FIELDS and type(value) is int and value > 0:
            out.append((path, key, value))
        sub = getattr(config, key, None)
        if hasattr(sub, "to_dict") and sub is not config and len(path) < 4:
            out += _layer_fields(sub, (*path, key))
    return out


def _with_layers(config: Any, counts: dict[tuple[tuple[str, ...], str], int]) -> Any:
    cfg = copy.deepcopy(config)
    for (path, key), n in counts.items():
        target = cfg
        for part in path:
            target = getattr(target, part)
        old = getattr(target, key)
        setattr(target, key, n)
        for name, value in list(vars(target).items()):  # per-layer lists (layer_types...) follow the count
            if isinstance(value, list) and len(value) == old and old > n:
                setattr(target, name, value[:n])
    return cfg


def _measure(cls: Any, config: Any) -> tuple[int, int]:
    """(elements, modules) of ``cls`` built from ``config`` on the meta device (no memory)."""
    with torch.device("meta"):
        model = cls._from_config(config)
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        seen[id(t)] = t.numel()
    return sum(seen.values()), sum(1 for _ in model.modules())


def estimate_size(cls: Any, config: Any) -> SizeEstimate:
    """Parameter and buffer bytes (in the config's dtype, else float32) and modules of ``cls(config)``."""
    fields = _layer_fields(config)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    itemsize = (
        getattr(torch, dtype.removeprefix("torch."), torch.float32).itemsize
        if isinstance(dtype, str)
        else dtype.itemsize
        if isinstance(dtype, torch.dtype)
        else 4
    )
    try:
        ones = {(p, k): 1 for p, k, _ in fields}
        base = _measure(cls, _with_layers(config, ones))
        numel, modules = base
        for p, k, n in fields:
            more = _measure(cls, _with_layers(config, {**ones, (p, k): 2}))
            numel += (more[0] - base[0]) * (n - 1)
            modules += (more[1] - base[1]) * (n - 1)
    except Exception:  # noqa: BLE001 - a config that does not build with fewer layers: build it whole
        if sum(n for _, _, n in fields) > MAX_UNESTIMATED_LAYERS:
            raise InspectorError(
                "config.json asks for "
                + ", ".join(f"{'.'.join((*p, k))} = {n}" for p, k, n in fields)
                + f" layers, and its size could not be estimated from fewer layers; more than "
                f"{MAX_UNESTIMATED_LAYERS} layers are never built without an estimate"
            ) from None
        try:
            numel, modules = _measure(cls, config)
        except Exception as exc:  # noqa: BLE001 - the config describes no model transformers can build
            raise InspectorError(
                f"the model described by config.json cannot be built even on the meta "
                f"device ({type(exc).__name__}: {str(exc)[:200]}); fix config.json"
            ) from None
    return SizeEstimate(numel * itemsize, modules)


def check_model_size(cls: Any, config: Any, folder: Path, max_bytes: int | None = None) -> SizeEstimate:
    """Refuse, before anything is allocated, a folder whose model would exceed ``max_bytes``
    (default :func:`default_max_bytes`) or :data:`MAX_MODULES` modules."""
    from ..utils.units import format_bytes

    limit = default_max_bytes() if max_bytes is None else max_bytes
    estimate = estimate_size(cls, config)
    if estimate.nbytes > limit:
        raise InspectorError(
            f"{folder} was refused: its config.json describes a {cls.__name__} of about "
            f"{format_bytes(estimate.nbytes)}, more than the limit of {format_bytes(limit)}. "
            "Nothing was built. "
            "If you mean it, raise the limit: --max-model-size on the command line, the sidebar's "
            "'Largest model' field, or INSPECTOR_MAX_MODEL_SIZE for the server."
        )
    if estimate.modules > max_modules():
        raise InspectorError(
            f"{folder} was refused: its config.json describes a {cls.__name__} of about {estimate.modules:,} "
            f"modules, more than the {max_modules():,} the inspector builds (INSPECTOR_MAX_MODULES for the "
            "server). Nothing was built; check the layer counts in config.json.")
    return estimate
