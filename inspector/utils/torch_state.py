"""Process-wide torch settings a model file may change, put back after its code ran.

A model file is code: importing it or calling its factory can call ``torch.set_default_dtype``,
``torch.set_grad_enabled(False)`` and the like, which would stay in effect for every later model
in the same process (every browser session of a dashboard). :func:`restored_torch_state` records
them before and restores them after, and says what had changed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _settings() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    settings: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
        "default dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "grad mode": (torch.is_grad_enabled, _set_grad_mode),
        "deterministic algorithms": (
            lambda: (torch.are_deterministic_algorithms_enabled(),
                     torch.is_deterministic_algorithms_warn_only_enabled()),
            lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        "anomaly detection": (
            lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            lambda v: torch.set_anomaly_enabled(v[0], v[1])),
        "float32 matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        "threads": (torch.get_num_threads, torch.set_num_threads),
        "cudnn flags": (lambda: (cudnn.enabled, cudnn.benchmark, cudnn.deterministic),
                        lambda v: _set_cudnn(*v)),
        "cuda matmul tf32": (lambda: matmul.allow_tf32, lambda v: setattr(matmul, "allow_tf32", v)),
    }
    if hasattr(torch, "get_default_device"):
        settings["default device"] = (torch.get_default_device, torch.set_default_device)
    return settings


def _set_grad_mode(enabled: bool) -> None:
    torch.set_grad_enabled(enabled)  # called, not entered: it sets the mode at once


def _set_cudnn(enabled: bool, benchmark: bool, deterministic: bool) -> None:
    torch.backends.cudnn.enabled = enabled
    torch.backends.cudnn.benchmark = benchmark
    torch.backends.cudnn.deterministic = deterministic


@contextmanager
def restored_torch_state(changed: list[str] | None = None) -> Iterator[None]:
    """Run the body, then put every process-wide torch setting back as it was (also when it raises).

    ``changed`` (if given) receives one ``"name: before -> after"`` line per setting the body changed.

    >>> notes = []
    >>> with restored_torch_state(notes):
    ...     torch.set_default_dtype(torch.float64)
    >>> torch.get_default_dtype(), notes
    (torch.float32, ['default dtype: torch.float32 -> torch.float64'])
    """
    settings = _settings()
    before = {name: get() for name, (get, _) in settings.items()}
    try:
        yield
    finally:
        for name, (get, put) in settings.items():
            now = get()
            if now != before[name]:
                put(before[name])
                if changed is not None:
                    changed.append(f"{name}: {before[name]} -> {now}")
