"""Available devices and a tie-preserving, in-place ``move_model``."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..inventory import TensorInventory, tensor_inventory
from ..utils.findings import InspectorError
from ..utils.units import format_bytes


@dataclass(frozen=True)
class DeviceInfo:
    """One device a model can be loaded onto."""

    name: str            # "cpu", "cuda:0", "mps", "meta"
    label: str           # for people: "cuda:0 — NVIDIA H200 (130.2 GiB of 139.8 GiB free)"
    kind: str            # "cpu" | "cuda" | "mps" | "meta"
    total_bytes: int | None = None
    free_bytes: int | None = None


def available_devices() -> list[DeviceInfo]:
    """cpu, every CUDA device (name, free/total memory), mps where present, and meta.

    >>> [d.name for d in available_devices()][0]
    'cpu'
    """
    out: list[DeviceInfo] = []
    total = free = None
    try:
        import psutil

        vm = psutil.virtual_memory()
        total, free = int(vm.total), int(vm.available)
    except ImportError:  # pragma: no cover - psutil ships with streamlit
        pass
    cpu_label = (
        "cpu"
        if total is None or free is None
        else f"cpu ({format_bytes(free)} of {format_bytes(total)} free)"
    )
    out.append(DeviceInfo("cpu", cpu_label, "cpu", total, free))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            free_b, total_b = torch.cuda.mem_get_info(i)
            name = torch.cuda.get_device_name(i)
            out.append(DeviceInfo(f"cuda:{i}", f"cuda:{i} — {name} ({format_bytes(free_b)} of "
                                  f"{format_bytes(total_b)} free)", "cuda", int(total_b), int(free_b)))
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        out.append(DeviceInfo("mps", "mps (Apple GPU)", "mps"))
    out.append(DeviceInfo("meta", "meta (structure only, no memory)", "meta"))
    return out


def device_names() -> list[str]:
    """The devices here, by name, without touching any GPU's memory (no CUDA context is made).

    >>> device_names()[0], device_names()[-1]
    ('cpu', 'meta')
    """
    names = ["cpu"]
    if torch.cuda.is_available():
        names += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        names.append("mps")
    names.append("meta")
    return names


def resolve_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device`` that exists here, or an InspectorError listing those that do.

    ``"cpu"`` and ``"meta"`` never touch CUDA; a CUDA index is checked against
    ``torch.cuda.device_count()`` (no context is created, no memory is queried).
    """
    if not isinstance(device, (str, torch.device)) or isinstance(device, bool):
        raise InspectorError(f"device must be a name such as 'cpu' or 'cuda:0', got "
                             f"{type(device).__name__} {device!r}. Available devices: "
                             f"{', '.join(device_names())}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError) as exc:
        raise InspectorError(f"unknown device {device!r}: {exc}. Available devices: "
                             f"{', '.join(device_names())}") from None
    if dev.type in ("cpu", "meta", "mps") and dev.index not in (None, 0):
        raise InspectorError(f"device {str(device)!r} does not exist: there is one {dev.type} device, "
                             f"named {dev.type!r}. Available devices: {', '.join(sorted(device_names()))}")
    if dev.type in ("cpu", "meta"):
        return dev
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", 0)
    names = device_names()
    key = dev.type if dev.type == "mps" else f"{dev.type}:{dev.index}"
    if key not in names:
        raise InspectorError(f"device {str(device)!r} is not available on this machine. "
                             f"Available devices: {', '.join(sorted(names))}")
    return dev


#: The complex dtype a complex tensor takes when a model is cast to a floating dtype (bfloat16 has none).
COMPLEX_OF = {torch.float16: torch.complex32, torch.float32: torch.complex64, torch.float64: torch.complex128}


def _target_dtype(t: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    # Like nn.Module.to: only floating point and complex tensors change dtype; a complex tensor
    # stays complex (its counterpart of ``dtype``, or its own dtype), never losing its imaginary part.
    if dtype is None or not (t.is_floating_point() or t.is_complex()):
        return t.dtype
    if t.is_complex() and not dtype.is_complex:
        return COMPLEX_OF.get(dtype, t.dtype)
    return dtype


def move_model(model: nn.Module, device: str | torch.device | None = None,
               dtype: torch.dtype | None = None, *, empty: bool = False) -> nn.Module:
    """Move and/or cast ``model`` in place, keeping every tie.

    One conversion map keyed by tensor identity, and one per storage, is kept for the
    whole call, so a Parameter held by two modules stays one Parameter, and different
    tensors over one storage stay over one (new) storage — whatever
    ``torch.__future__.get_overwrite_module_params_on_conversion()`` says. Gradients move too.

    Args:
        model: changed in place and returned.
        device: target device (None keeps each tensor's device).
        dtype: target floating-point dtype (integer and bool tensors keep theirs).
        empty: allow moving off the meta device, giving uninitialised tensors.

    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2, bias=False), nn.Linear(2, 2, bias=False))
    >>> m[1].weight = m[0].weight
    >>> _ = move_model(m, dtype=torch.float64)
    >>> m[0].weight is m[1].weight, m[0].weight.dtype
    (True, torch.float64)
    """
    dev, dtype = _target(device, dtype)
    inv = tensor_inventory(model)
    if dev is not None and dev.type != "meta" and not empty:
        on_meta = [e.name for e in inv.unique_entries() if e.device.type == "meta"]
        if on_meta:
            raise InspectorError(
                f"{len(on_meta)} tensors (first: {on_meta[0]}) are on the meta device and hold no "
                f"data, so they cannot be moved to {dev}. Load real weights (a checkpoint) instead, "
                "or ask for uninitialised memory with empty=True.")
    converted = _convert_all(inv, dev, dtype)
    replaced: dict[int, nn.Parameter] = {}  # Parameters that had to be new objects, for every holder
    with torch.no_grad():
        for module in model.modules():
            _put_back(module, converted, replaced)
    return model


def _target(device: str | torch.device | None,
            dtype: torch.dtype | str | None) -> tuple[torch.device | None, torch.dtype | None]:
    """The device and floating-point dtype asked for, checked."""
    dev = resolve_device(device) if device is not None else None
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), dtype)
    if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
        raise InspectorError(f"dtype {dtype!r} is not a floating-point torch dtype; choose one of "
                             "float32, float16, bfloat16, float64 (integer tensors keep theirs anyway)")
    return dev, dtype


def _put_back(
    module: nn.Module, converted: dict[int, torch.Tensor], replaced: dict[int, nn.Parameter]
) -> None:
    """Give ``module``'s own parameters and buffers their converted data, in place.

    A Parameter keeps its object (``p.data = new``) so every module holding it sees the change;
    where torch cannot swap the data (meta -> cpu) one new Parameter replaces it for every holder.
    """
    for name, p in module._parameters.items():
        if p is None:
            continue
        if id(p) in replaced:
            module._parameters[name] = replaced[id(p)]
            continue
        new = converted[id(p)]
        if new is p.data:
            continue
        grad = p.grad
        if torch._has_compatible_shallow_copy_type(p.data, new):
            p.data = new
            target = p
        else:
            target = nn.Parameter(new, requires_grad=p.requires_grad)
            replaced[id(p)] = target
            module._parameters[name] = target
        if grad is not None:
            target.grad = grad.to(device=new.device, dtype=new.dtype)
    for name, b in module._buffers.items():
        if b is not None:
            module._buffers[name] = converted[id(b)]


def _convert_all(inv: TensorInventory, dev: torch.device | None,
                 dtype: torch.dtype | None) -> dict[int, torch.Tensor]:
    """id(tensor) -> converted data; tensors over one storage stay over one new storage."""
    out: dict[int, torch.Tensor] = {}
    for objs in inv.by_storage.values():
        group = [inv.entries[inv.unique[o]].tensor for o in objs]
        if len(group) == 1:
            out[id(group[0])] = _convert_one(group[0], dev, dtype)
        else:
            out.update(_convert_shared(group, dev, dtype))
    for e in inv.unique_entries():
        if e.storage_key is None:  # no memory to share (meta, empty, sparse, quantized, DTensor)
            out[id(e.tensor)] = _convert_one(e.tensor, dev, dtype)
    return out


def _convert_one(t: torch.Tensor, dev: torch.device | None, dtype: torch.dtype | None) -> torch.Tensor:
    data = t.data if isinstance(t, nn.Parameter) else t
    target_dtype = _target_dtype(t, dtype)
    target_dev = dev if dev is not None else t.device
    if data.device.type == "meta" and target_dev.type != "meta":
        return torch.empty_like(data, device=target_dev, dtype=target_dtype)
    if data.device == target_dev and data.dtype == target_dtype:
        return data
    return data.to(device=target_dev, dtype=target_dtype)


def _convert_shared(group: list[torch.Tensor], dev: torch.device | None,
                    dtype: torch.dtype | None) -> dict[int, torch.Tensor]:
    """Convert one storage once and rebuild every view of it on the new storage."""
    first = group[0]
    if any(t.dtype != first.dtype for t in group):  # mixed dtypes over one storage: convert each
        return {id(t): _convert_one(t, dev, dtype) for t in group}
    target_dtype = _target_dtype(first, dtype)
    target_dev = dev if dev is not None else first.device
    if first.device == target_dev and first.dtype == target_dtype:
        return {id(t): (t.data if isinstance(t, nn.Parameter) else t) for t in group}
    storage = first.untyped_storage()
    n = storage.nbytes() // first.element_size()
    base = torch.empty(0, dtype=first.dtype, device=first.device).set_(storage, 0, (n,), (1,))
    new_base = base.to(device=target_dev, dtype=target_dtype)
    return {id(t): new_base.as_strided(t.shape, t.stride(), t.storage_offset()) for t in group}
