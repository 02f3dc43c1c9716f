"""``replay(run_path, step, model=...)`` itself: the step run again under full inspection, compared with
what the run recorded, and its findings (what already held NaN/Inf, the first op that made it, a loss
that differs)."""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from ...capture import capturing
from ...loading import LoadedModel
from ...offsets import gradient_norms
from ...utils.findings import Finding, InspectorError
from ...utils.forward_state import module_state_kept
from ...utils.labels import BATCH_LABEL, ROOT_LABEL
from ..calls import floating_leaves, rebuild
from ..files import KeptStep, ReplayFile
from ..keeping import StepKeeper
from ..ops import OpRecord, finding_ops
from .forward import _replay_calls, _weights_in, versions_kept
from .kept import _check_weights, _kept_file, _recorded, _the_model
from .result import Replay

CAPTURE_BYTES = 256 << 20


def _total_norm(grads: pd.DataFrame) -> float | None:
    """The norm of every gradient together, from the per-parameter norms (NaN/Inf when one is)."""
    present = grads[grads["state"].isin(["ok", "nonfinite"])]
    if not len(present):
        return None
    if (present["state"] == "nonfinite").any():
        return math.nan
    return math.sqrt(float((present["norm"].astype("float64") ** 2).sum()))


def _same(a: float, b: float, tolerance: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if tolerance == 0.0:
        return struct.pack("<d", a) == struct.pack("<d", b)
    return a == b or abs(a - b) <= tolerance * max(abs(a), abs(b))


def replay(
    run_path: str | os.PathLike,
    step: int,
    model: nn.Module | str | LoadedModel,
    *,
    loss: Callable[[Any, Any], torch.Tensor] | None = None,
    rank: int = 0,
    capture_bytes: int = CAPTURE_BYTES,
    tolerance: float | None = None,
) -> Replay:
    """Run step ``step`` of a watched run again, from what ``watch(..., keep=True)`` kept.

    Args:
        run_path: the run file; the replay files lie next to it.
        step: the step to replay (as the run counts them).
        model: the model the run trained: the live object, a :class:`LoadedModel`, or the spec the
            ``watch`` command used (``file.py:factory``, ``hf:folder``, ``sample:name``). Its weights are
            replaced by the kept ones for the replay and put back after; no code comes from the file.
        loss: ``loss(outputs, inputs)`` as the training loop computed it (``inputs``: the call's one
            tensor, its kwargs, or its tuple of arguments); default: the model file's ``loss``, else
            ``outputs.loss`` or a one-element output. Without one, only the forward runs.
        rank: which rank's kept step (each rank keeps its own).
        capture_bytes: the byte budget of the module captures.
        tolerance: relative tolerance for ``reproduced``; default 0 (bit-equal) on the CPU, 1e-5 on a GPU.

    Raises:
        InspectorError: the step was not kept, the file is damaged or forged or belongs to another model,
            the model spec did not build.
    """
    path = Path(run_path)
    if not os.path.lexists(path):
        raise InspectorError(f"run file {path} does not exist; give the run file the watch wrote")
    f, kept = _kept_file(path, step, rank)
    net, spec_loss = _the_model(model, str(path))
    hooks = net._forward_pre_hooks.values()
    if any(isinstance(getattr(h, "__self__", None), StepKeeper) for h in hooks):
        raise InspectorError(f"replay of {path.name}: the model is being watched with keep=True; call "
                             "w.replay(step) on that watch, or replay after the `with watch(...)` block ends "
                             "(its hooks would take the replay for a step)")
    _check_weights(f, net)
    recorded, recorded_norm = _recorded(path, step, rank, kept)
    own = kept.calls[-1].loss if kept.calls else None
    if loss is None and spec_loss is None and own is not None:
        recorded = own  # what the replay computes: the model's own loss (a Trainer logs after the update)
    device = next((p.device for p in net.parameters()), torch.device("cpu"))
    tol = tolerance if tolerance is not None else (0.0 if device.type == "cpu" else 1e-5)
    named = {n or ROOT_LABEL: m for n, m in net.named_modules()}
    batch_bad, weights_bad, notes = _kept_nonfinite(f, kept)
    devices = [device.index or 0] if device.type == "cuda" else []
    with ExitStack() as stack:
        stack.enter_context(versions_kept(net))  # entered first: set back after every write below
        stack.enter_context(torch.random.fork_rng(devices=devices))
        stack.enter_context(module_state_kept(list(named.items())))
        stack.enter_context(_weights_in(net, f, kept.step))
        with capturing(net, max_bytes=capture_bytes, keep_inputs=True) as cap, finding_ops(net) as finder:
            losses = _replay_calls(net, f, kept, loss or spec_loss, named)
        grads = gradient_norms(net)
    found = tuple(finder.found)
    ops = tuple(o for o in found if o.phase == "forward") + tuple(o for o in found if o.phase == "backward")
    last = losses[-1] if losses else None
    reproduced = None if last is None or recorded is None else _same(last, recorded, tol)
    findings = _findings(ops, tuple(batch_bad), weights_bad, reproduced, last, recorded, step)
    return Replay(
        str(path),
        step,
        rank,
        str(f.path),
        reproduced,
        last,
        tuple(losses),
        recorded,
        ops,
        tuple(batch_bad),
        weights_bad,
        cap.result,
        grads,
        findings,
        tol,
        tuple(notes),
        _total_norm(grads),
        recorded_norm,
    )


def _kept_nonfinite(f: ReplayFile, kept: KeptStep) -> tuple[list[str], tuple[str, ...], list[str]]:
    """What already held NaN/Inf in the kept step: the batch's floating inputs, the weights; and notes (batch
    tensors written in place after the step, buffers with NaN/Inf)."""
    batch_bad = []
    for i, call in enumerate(kept.calls):
        tensors = {f"s{kept.step}/c{i}/{k}": t for k, t in f.tensors(f"s{kept.step}/c{i}/").items()}
        for part, node in (("args", call.args), ("kwargs", call.kwargs)):
            leaves = floating_leaves(rebuild(node, tensors, f.path.name), part)
            batch_bad += [p for p, t in leaves if not bool(torch.isfinite(t).all())]
    notes = [f"call {i}: batch tensors {', '.join(c.written)} were written in place after the step; the file "
             "holds them as they were when written" for i, c in enumerate(kept.calls) if c.written]
    buffers_bad = _nonfinite(f.tensors(f"s{kept.step}/b/"))
    if buffers_bad:  # kept after the forward, which may have written them (BatchNorm's statistics)
        notes.append(f"buffers holding NaN/Inf when kept, after the step's forward (which may have written "
                     f"them): {', '.join(buffers_bad[:5])}")
    return batch_bad, _nonfinite(f.tensors(f"s{kept.step}/w/")), notes


def _nonfinite(tensors: dict[str, torch.Tensor]) -> tuple[str, ...]:
    return tuple(
        n
        for n, t in tensors.items()
        if (t.is_floating_point() or t.is_complex()) and not bool(torch.isfinite(t).all())
    )


def _findings(
    ops: tuple[OpRecord, ...],
    batch: tuple[str, ...],
    weights: tuple[str, ...],
    reproduced: bool | None,
    loss: float | None,
    recorded: float | None,
    step: int,
) -> tuple[Finding, ...]:
    out = []
    if batch:
        out.append(
            Finding(
                "nonfinite-forward",
                "error",
                BATCH_LABEL,
                f"replayed step {step}: the batch itself holds NaN/Inf ({', '.join(batch)})",
            )
        )
    if weights:
        out.append(
            Finding(
                "nonfinite-parameter",
                "error",
                weights[0],
                f"replayed step {step}: the weights the step used already held NaN/Inf "
                f"({', '.join(weights[:5])}{', ...' if len(weights) > 5 else ''})",
            )
        )
    for phase in ("forward", "backward"):
        first = next((o for o in ops if o.phase == phase), None)
        if first is not None:
            out.append(
                Finding(f"nonfinite-{phase}", "error", first.module, f"replayed step {step}: {first.line()}")
            )
    if reproduced is False:
        out.append(
            Finding(
                "replay-differs",
                "warning",
                ROOT_LABEL,
                f"replayed step {step} gave the loss {loss!r} where the run recorded {recorded!r}: the "
                "model, its code or the loss function differ from the run's, or the step used "
                "something the watch does not keep (data changed in place, another random source)",
            )
        )
    return tuple(out)
