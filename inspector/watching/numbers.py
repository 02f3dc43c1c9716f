"""One rank's numbers at one step, as a builder that packs into one vector (for ``all_gather``)."""

from __future__ import annotations

import math
import os
import resource
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..utils.process_memory import rss_and_peak

_SCALARS = [
    "step_time",
    "loss",
    "grad_norm",
    "nonfinite",
    "scale",
    "skipped",
    "device_allocated",
    "device_peak",
    "rss",
    "forward",
    "backward",
    "checked",
    "shared",
    "loss_logged",
    "stop",
    "compute",
]
_MODULE = ["module_grad", "module_param", "module_update", "module_nonfinite"]
_PARAM = ["param_grad", "has_grad", "param_norm"]

NO_PRODUCER, BATCH_PRODUCER = -1.0, -2.0


def nans(width: int) -> np.ndarray:
    """A new float64 array of ``width`` NaNs: a copy of one kept per width (a fifth of ``np.full``'s time,
    which counts where a step makes a dozen)."""
    kept = _NANS.get(width)
    if kept is None:
        kept = _NANS[width] = np.full(width, np.nan)
    return kept.copy()


_NANS: dict[int, np.ndarray] = {}


def all_finite(values: np.ndarray) -> bool:
    """Whether the sum of ``values`` is finite: then each of them is (a NaN or an Inf makes the sum NaN or
    Inf); a sum that overflows says False for finite values, so a caller that takes False as "look at
    each" is never wrong. One reduction, at a third of ``np.isfinite(values).all()``'s cost."""
    return not len(values) or math.isfinite(np.add.reduce(values))


class _once:
    """``functools.cached_property`` without its lock (Python 3.11 takes one at every first read, which
    cost more than the arrays worked out here): the value is stored on the instance, which is then read
    instead of this descriptor."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn, self.name = fn, fn.__name__
        self.__doc__ = fn.__doc__

    def __get__(self, obj: Any, cls: Any = None) -> Any:
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


@dataclass
class Numbers:
    """What one rank measured at one step (NaN where not taken); ``forward``/``backward`` are
    indices into the model's ``named_modules()`` (``NO_PRODUCER``, ``BATCH_PRODUCER``)."""

    modules: int
    parameters: int
    buffers: int = 0
    step_time: float = math.nan
    loss: float = math.nan
    grad_norm: float = math.nan
    nonfinite: float = 0.0
    scale: float = math.nan
    skipped: float = 0.0
    device_allocated: float = math.nan
    device_peak: float = math.nan
    rss: float = math.nan
    forward: float = NO_PRODUCER
    backward: float = NO_PRODUCER
    checked: float = 0.0  # 1: a check step (parameter norms taken)
    shared: float = 0.0  # how many findings this rank's own checks made (gathered when any rank has one)
    loss_logged: float = 0.0  # 1: a loss was logged (``loss`` NaN then means the loss was NaN)
    stop: float = 0.0  # 1: this rank asks every rank to stop at this step boundary
    compute: float = math.nan  # seconds before the step's first collective: batch loading and forward pass
    module_grad: np.ndarray = field(default_factory=lambda: np.zeros(0))
    module_param: np.ndarray = field(default_factory=lambda: np.zeros(0))
    module_update: np.ndarray = field(default_factory=lambda: np.zeros(0))
    module_nonfinite: np.ndarray = field(default_factory=lambda: np.zeros(0))
    param_grad: np.ndarray = field(default_factory=lambda: np.zeros(0))
    has_grad: np.ndarray = field(default_factory=lambda: np.zeros(0))
    param_norm: np.ndarray = field(default_factory=lambda: np.zeros(0))
    buffer_norm: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        for name in _MODULE:
            if not len(getattr(self, name)):
                setattr(self, name, nans(self.modules))
        for name in _PARAM:
            if not len(getattr(self, name)):
                setattr(self, name, nans(self.parameters))
        if not len(self.buffer_norm):
            self.buffer_norm = nans(self.buffers)

    # What several checks read of the step's numbers, worked out once per step on first use (the numbers
    # are complete by then: a check reads them after :func:`~.steps.transfer_step` returns them)
    whole = False  # set by the step that measured them: every parameter has a gradient whose norm is finite

    @_once
    def no_grad(self) -> np.ndarray:
        """Per parameter: no gradient, or an all-zero one (norm 0); a NaN/Inf norm is not zero."""
        if self.whole:  # (what the line below comes to then)
            return self.param_grad == 0
        return ~self.has_grad | (self.param_grad == 0)

    @_once
    def moving(self) -> np.ndarray:
        """Per parameter: a finite non-zero gradient norm and a finite parameter norm (at a check step)."""
        grad = self.param_grad
        if self.whole:  # (what the line below comes to then)
            return (grad > 0) & np.isfinite(self.param_norm)
        return self.has_grad & np.isfinite(grad) & (grad > 0) & np.isfinite(self.param_norm)

    @_once
    def weights_finite(self) -> bool:
        """Every parameter and buffer norm is a finite number (none NaN, Inf or not taken); False also
        where the sum of the norms overflows (the callers then look at each one)."""
        return all_finite(self.param_norm) and all_finite(self.buffer_norm)

    def pack(self) -> torch.Tensor:
        """Everything as one float64 vector of a length fixed by the layout."""
        parts = [np.asarray([getattr(self, n) for n in _SCALARS], dtype=np.float64)]
        parts += [np.asarray(getattr(self, n), dtype=np.float64) for n in _MODULE + _PARAM + ["buffer_norm"]]
        return torch.from_numpy(np.concatenate(parts))

    @classmethod
    def unpack(cls, vector: np.ndarray, modules: int, parameters: int, buffers: int) -> Numbers:
        out = cls(modules, parameters, buffers)
        for n, v in zip(_SCALARS, vector[:len(_SCALARS)], strict=True):
            setattr(out, n, float(v))
        start = len(_SCALARS)
        for names, width in ((_MODULE, modules), (_PARAM, parameters), (["buffer_norm"], buffers)):
            for n in names:
                setattr(out, n, np.asarray(vector[start:start + width], dtype=np.float64))
                start += width
        out.has_grad = out.has_grad > 0
        return out


def memory(device: torch.device | None, rss: Resident | None = None) -> tuple[float, float, float]:
    """Device memory allocated and peak (CUDA; NaN elsewhere) and this process's current RSS, in
    bytes (NaN where the system tells only the peak); ``rss`` reads it (a :class:`Resident` kept by the
    caller), else it is read afresh."""
    alloc = peak = math.nan
    if device is not None and device.type == "cuda":
        alloc = float(torch.cuda.memory_allocated(device))
        peak = float(torch.cuda.max_memory_allocated(device))
    return alloc, peak, rss() if rss is not None else rss_and_peak()[0]


class Resident:
    """This process's resident set size in bytes, as :func:`~inspector.utils.process_memory.rss_and_peak`
    reads it (``/proc/self/statm``), with the file kept open: one ``pread`` a call (about 1 us against 9
    us to open, read and close it, every step). Opened again in a forked child (told by a fork hook, not
    by asking for the process id at every call); :meth:`close` closes it; NaN where there is no such
    file."""

    def __init__(self) -> None:
        self._file: Any = None
        self._fd = -1
        self._opened = -1  # the fork generation it was opened in (-1: not yet)

    def __call__(self) -> float:
        if self._opened != _FORKS[0]:
            self.close()
            self._opened = _FORKS[0]
            try:
                self._file = open("/proc/self/statm", "rb", buffering=0)  # noqa: SIM115 - closed by close()
                self._fd = self._file.fileno()
            except OSError:
                self._file = None
        if self._file is None:
            return rss_and_peak()[0]
        try:
            return float(int(os.pread(self._fd, 256, 0).split()[1]) * _PAGE)
        except (OSError, ValueError, IndexError):
            return math.nan

    def close(self) -> None:
        if self._file is not None and self._opened == _FORKS[0]:  # (a parent's file is the parent's)
            self._file.close()
        self._file, self._fd, self._opened = None, -1, -1


_PAGE = resource.getpagesize()
_FORKS = [0]  # in a forked child, one more than in its parent: a Resident opened before the fork opens again


def _forked() -> None:
    _FORKS[0] += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
