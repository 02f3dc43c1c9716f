"""Keep the dashboard quick on big models: what may run as soon as a page opens, cheap probes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..loading.models import LoadedModel
from ..structure.summary import model_bytes

if TYPE_CHECKING:
    from ..attribution import TargetInfo

AUTO_RUN_BYTES = 16 * 2**20  # models up to this size are analysed as soon as a page opens


def runs_at_once(model: nn.Module, limit: int = AUTO_RUN_BYTES) -> bool:
    """True when ``model`` is small enough (parameters and buffers, in bytes) to analyse unasked.

    Bigger models wait for an explicit button on the pages that run forward/backward passes.

    >>> runs_at_once(nn.Linear(2, 3)), runs_at_once(nn.Linear(2, 3), limit=35)  # 36 bytes
    (True, False)
    """
    return model_bytes(model) <= limit


def quick_target_info(loaded: LoadedModel, inputs: Any = None) -> TargetInfo:
    """:func:`inspector.attribution.target_info` from one token of one sample when it can.

    For a ``(B, T)`` tensor of token ids the model first runs on ``inputs[:1, :1]``: a next-token
    model answers ``(1, 1, V)`` (one output position per input token), so the targets are the
    ``V`` ids and the positions the ``T`` of ``inputs``, at the cost of a one-token forward pass.
    Any other input or answer (no position, several, an error) gets the full forward pass of
    ``target_info`` on one sample. A model that keeps one position for one token but truncates
    longer inputs is not told apart: its positions are over-counted.

    >>> from inspector.loading.models import load_model
    >>> quick_target_info(load_model("sample:tiny-gpt2"))
    TargetInfo(outputs=32, positions=16)
    """
    from ..attribution import TargetInfo, target_info  # captum: imported by the pages that attribute

    inputs = loaded.example_inputs(1) if inputs is None else inputs
    if isinstance(inputs, torch.Tensor) and inputs.dim() == 2 and not inputs.is_floating_point() \
            and not inputs.is_complex() and inputs.shape[1] > 1:
        try:
            one = target_info(loaded, inputs[:1, :1])
        except Exception:  # noqa: BLE001 - e.g. a model that needs more than one token: ask the full pass
            one = None
        if one is not None and one.positions == 1:
            return TargetInfo(one.outputs, int(inputs.shape[1]))
    if isinstance(inputs, torch.Tensor) and inputs.dim() >= 1 and inputs.shape[0] > 1:
        inputs = inputs[:1]
    return target_info(loaded, inputs)
