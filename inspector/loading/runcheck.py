"""Can the loaded model run here, in its dtype on its device? Found by trying one small forward pass.

Some dtypes lack kernels on some devices (float16 convolutions on older CPUs, bfloat16 on
older GPUs). Rather than keep a table that goes stale with every torch release, the model
runs once on one example input, in eval mode and without gradients, under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..utils.findings import first_line
from ..utils.forward_state import module_state_kept
from .models import LoadedModel
from .running import call_model


@dataclass(frozen=True)
class RunCheck:
    """The outcome of one small forward pass of a loaded model.

    ``ok`` is True when it ran (or when there is nothing to try: no example inputs, the
    meta device). ``error`` is the exception's message when it did not.
    """

    ok: bool
    name: str
    dtype: str
    device: str
    error: str = ""
    converted: bool = False  # the dtype was asked for at load time (not the model's own)

    def describe(self) -> str:
        """One sentence for people; empty when the model runs."""
        if self.ok:
            return ""
        if self.converted:
            return (f"{self.name} cannot run as {self.dtype} on {self.device}: a forward pass on one "
                    f"example input fails with {self.error}")
        return f"{self.name} fails a forward pass on one example input on {self.device}: {self.error}"


def _dtype_name(loaded: LoadedModel) -> str:
    dt = loaded.input_dtype()
    return str(dt).removeprefix("torch.") if dt is not None else "its dtype"


def try_forward(loaded: LoadedModel) -> RunCheck:
    """Run ``loaded`` once on one example input to see whether its dtype runs on its device.

    The model is left as it was: eval mode inside, every module's training flag restored,
    no gradients (so no ``.grad`` is touched), and the model's lock is held.

    >>> from inspector.loading.models import load_model
    >>> try_forward(load_model("sample:cnn-bn", dtype="float16")).ok
    True
    """
    device, dtype = str(loaded.input_device()), _dtype_name(loaded)
    if loaded.is_meta or loaded.inputs_fn is None:
        return RunCheck(True, loaded.name, dtype, device)
    model = loaded.model
    with loaded.lock, module_state_kept(list(model.named_modules())):
        modes = {m: m.training for m in model.modules()}
        try:
            model.eval()
            inputs: Any = loaded.example_inputs(1)
            with torch.no_grad():
                call_model(model, inputs)
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            first = first_line(exc) or type(exc).__name__
            return RunCheck(False, loaded.name, dtype, device, f"{type(exc).__name__}: {first}",
                            converted=loaded.dtype is not None)
        finally:
            for m, was in modes.items():
                m.training = was
    return RunCheck(True, loaded.name, dtype, device)
