"""``replay(run_path, step, model=...)``: run a kept step again under full inspection.

The weights the step's forward used go into the model (in place, under ``no_grad``), the generators
and the autocast state are set as they were when each of its forward calls began, the modules' modes
too; then each call runs forward and backward again, with every module's output (and inputs) copied
(:func:`~inspector.capture.capturing`, within its byte budget) and every op checked for the first
NaN/Inf it made (:mod:`.ops`). Afterwards the model is as it was: its weights, buffers, gradients,
modes, attributes and the generators are put back (what the user's own hooks did during the replay,
such as a counter of calls, is theirs).
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from torch import nn

from ..capture import Captures, capturing
from ..loading import LoadedModel, load_model
from ..offsets import gradient_norms
from ..runfiles import read_run
from ..utils.findings import Finding, InspectorError
from ..utils.forward_state import module_state_kept
from ..utils.labels import BATCH_LABEL, ROOT_LABEL
from ..utils.paths import confined
from ..utils.wrappers import underlying
from .calls import as_inputs, floating_leaves, rebuild
from .files import KeptStep, ReplayFile, replay_files
from .keeping import StepKeeper
from .ops import OpRecord, finding_ops

CAPTURE_BYTES = 256 << 20


@dataclass(frozen=True, eq=False)
class Replay:
    """What :func:`replay` found when it ran a kept step again.

    Attributes:
        run_path, step, rank: the run file, the step and the rank replayed.
        file: the replay file it read.
        reproduced: whether the replayed loss equals the one the run recorded, bit for bit (CPU) or
            within ``tolerance`` (relative, on a GPU); None when there is no loss to compare.
        loss: the loss of the step's last forward call as replayed (None without a loss function);
            ``losses``: one per forward call of the step.
        recorded_loss: the loss the run file (else the replay file) recorded at that step; when the replay
            computes the model's own loss (no ``loss`` given, none in the model file) and the step's last
            call returned one (``outputs.loss``), that one as the watch kept it.
        grad_norm, recorded_grad_norm: the total gradient norm replayed and the one the run recorded
            (:attr:`gradients_match` compares them).
        ops: the ops that made NaN/Inf from finite inputs, forward first, each in the order it ran.
        batch_nonfinite: the batch's floating inputs that already held NaN/Inf (the batch made them).
        weights_nonfinite: the kept parameters and buffers that already held NaN/Inf (written before).
        captures: every module's output and inputs as detached copies (within the byte budget).
        gradients: one row per parameter: ``name, norm, state`` (:func:`~inspector.gradient_norms`).
        findings: the culprits and what could not be compared, as findings.
        tolerance: the relative tolerance used for ``reproduced`` (0.0 on the CPU).
        notes: what the replay could not do as the step did (a batch written in place since, ...).
    """

    run_path: str
    step: int
    rank: int
    file: str
    reproduced: bool | None
    loss: float | None
    losses: tuple[float, ...]
    recorded_loss: float | None
    ops: tuple[OpRecord, ...]
    batch_nonfinite: tuple[str, ...]
    weights_nonfinite: tuple[str, ...]
    captures: Captures = field(repr=False)
    gradients: pd.DataFrame = field(repr=False)
    findings: tuple[Finding, ...] = ()
    tolerance: float = 0.0
    notes: tuple[str, ...] = ()
    grad_norm: float | None = None
    recorded_grad_norm: float | None = None

    @property
    def gradients_match(self) -> bool | None:
        """Whether the replayed step's total gradient norm is the one the run recorded (both NaN/Inf, or
        within 1e-4 relative: the two sum in another order); None when either is missing. A loop that
        scales each call's loss (accumulation) recorded the scaled gradients: they differ by that factor."""
        a, b = self.grad_norm, self.recorded_grad_norm
        if a is None or b is None:
            return None
        if not (math.isfinite(a) and math.isfinite(b)):
            return not math.isfinite(a) and not math.isfinite(b)
        return abs(a - b) <= 1e-4 * max(abs(a), abs(b))

    @property
    def first(self) -> OpRecord | None:
        """The first op that made NaN/Inf (the forward's, else the backward's)."""
        return self.ops[0] if self.ops else None

    def first_in(self, phase: str) -> OpRecord | None:
        return next((o for o in self.ops if o.phase == phase), None)

    def to_dict(self) -> dict[str, Any]:
        """The replay as plain data (the report's section and ``replay --json``): no tensors."""
        from dataclasses import asdict

        return {
            "run": self.run_path,
            "step": self.step,
            "rank": self.rank,
            "file": self.file,
            "reproduced": self.reproduced,
            "loss": self.loss,
            "losses": list(self.losses),
            "recorded_loss": self.recorded_loss,
            "grad_norm": self.grad_norm,
            "recorded_grad_norm": self.recorded_grad_norm,
            "gradients_match": self.gradients_match,
            "tolerance": self.tolerance,
            "verdict": self.verdict(),
            "ops": [asdict(o) for o in self.ops],
            "batch_nonfinite": list(self.batch_nonfinite),
            "weights_nonfinite": list(self.weights_nonfinite),
            "captured": list(self.captures.order),
            "gradients": self.gradients[["name", "norm", "state"]].to_dict("records"),
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
        }

    def verdict(self) -> str:
        """One line: reproduced or not, and where the first NaN/Inf came from."""
        rep = {True: "reproduced", False: "NOT reproduced", None: "no loss to compare"}[self.reproduced]
        if self.loss is not None and self.recorded_loss is not None:
            rep += f" (loss {self.loss!r}, recorded {self.recorded_loss!r})"
        if self.batch_nonfinite:
            cause = f"the batch held NaN/Inf in {', '.join(self.batch_nonfinite)}"
        elif self.weights_nonfinite:
            cause = f"the weights held NaN/Inf before the step: {', '.join(self.weights_nonfinite[:3])}"
        elif self.first is not None:
            cause = f"first NaN/Inf: {self.first.line()}"
        else:
            cause = "no op made NaN/Inf from finite inputs"
        return f"step {self.step}: {rep}; {cause}"


# -- finding the file and the model -------------------------------------------------------------
def _kept_file(run_path: Path, step: int, rank: int) -> tuple[ReplayFile, KeptStep]:
    def inside(t: str) -> str:
        return (f"replay file {t} is a link that leads outside {run_path.parent}; a run's replay files lie "
                "next to it")

    files = [ReplayFile(confined(f, [run_path.parent], what="replay file", refusal=inside))
             for f in replay_files(run_path)]
    mine = [f for f in files if f.meta.rank == rank]
    for f in sorted(mine, key=lambda f: f.meta.step):
        kept = f.meta.kept(step)
        if kept is not None and kept.weights:
            return f, kept
    held = sorted({(s.step, s.weights) for f in mine for s in f.meta.steps})
    where = f"rank {rank} of " if rank else ""
    if not held:
        raise InspectorError(
            f"step {step} of {where}{run_path.name} was not kept: no replay file lies next to it. "
            "Watch with keep=True: a step whose error finding (NaN/Inf gradients or loss, "
            "an exploding gradient) is seen before the update is kept"
        )
    listed = ", ".join(f"{s}{'' if w else ' (no weights)'}" for s, w in held)
    raise InspectorError(
        f"step {step} of {where}{run_path.name} was not kept with its weights; its replay files "
        f"hold steps {listed}. A finding after the update needs keep_weights=True"
    )


def _the_model(model: nn.Module | str | LoadedModel, run: str) -> tuple[nn.Module, Callable | None]:
    if isinstance(model, LoadedModel):
        return model.model, (model.loss if model.has_loss else None)
    if isinstance(model, nn.Module):
        return underlying(model), None
    if isinstance(model, str):
        try:
            loaded = load_model(model)
        except InspectorError as exc:
            raise InspectorError(f"replay of {run}: the model {model!r} did not build: {exc}") from None
        return loaded.model, (loaded.loss if loaded.has_loss else None)
    raise InspectorError(
        f"replay needs model= an nn.Module, a LoadedModel or a spec such as 'file.py:factory', "
        f"got {type(model).__name__}"
    )


def _check_weights(f: ReplayFile, model: nn.Module) -> None:
    """The file's weights against the model: the same names and shapes, else an error naming both."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    for kind, names, own in (("parameter", f.meta.parameters, params), ("buffer", f.meta.buffers, buffers)):
        missing, extra = [n for n in own if n not in set(names)], [n for n in names if n not in own]
        if missing or extra:
            raise InspectorError(
                f"replay file {f.path.name} holds the weights of another model ({f.meta.model!r}): "
                + "; ".join(
                    x
                    for x in (
                        f"{len(extra)} {kind} name(s) not in this model, first {extra[0]!r}" if extra else "",
                        f"{len(missing)} of this model's not in the file, first {missing[0]!r}"
                        if missing
                        else "",
                    )
                    if x
                )
                + ". Pass the model the run trained"
            )
    step = next(s for s in f.meta.steps if s.weights).step
    for prefix, own in ((f"s{step}/w/", params), (f"s{step}/b/", buffers)):
        for n, t in own.items():
            shape = f.shapes[prefix + n]
            if shape != tuple(t.shape):
                raise InspectorError(
                    f"replay file {f.path.name}: {n} has shape {list(shape)} there and {list(t.shape)} in "
                    "this model; pass the model the run trained (the same sizes)"
                )


def _recorded(run_path: Path, step: int, rank: int, kept: KeptStep) -> tuple[float | None, float | None]:
    """The loss (else the one the keeper read) and the total gradient norm the run recorded at ``step``."""
    run = read_run(run_path)
    rows = run.steps[(run.steps["step"] == step) & (run.steps["rank"] == rank)]
    loss = float(rows["loss"].iloc[-1]) if len(rows) and bool(rows["loss_logged"].iloc[-1]) else kept.loss
    norm = float(rows["grad_norm"].iloc[-1]) if len(rows) else None
    return loss, norm


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


# -- the replay --------------------------------------------------------------------------------
@contextmanager
def _weights_in(model: nn.Module, f: ReplayFile, step: int) -> Iterator[None]:
    """The kept weights in the model's own tensors (in place) and no gradients; all put back after."""
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    kept_w, kept_b = f.tensors(f"s{step}/w/"), f.tensors(f"s{step}/b/")
    saved = {n: p.detach().clone() for n, p in params.items()}
    saved_b = {n: b.detach().clone() for n, b in buffers.items()}
    grads = {n: p.grad for n, p in params.items()}
    try:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(kept_w[n])
                p.grad = None
            for n, b in buffers.items():
                b.copy_(kept_b[n])
        yield
    finally:
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(saved[n])
                p.grad = grads[n]
            for n, b in buffers.items():
                b.copy_(saved_b[n])


@contextmanager
def versions_kept(root: nn.Module) -> Iterator[None]:
    """The version counters of ``root``'s parameters and buffers set back to what they were when the
    block ends (the replay writes each twice: the kept weights in, the model's own back). Where torch
    cannot set them (a torch without ``_unsafe_set_version_counter``), they are left moved."""
    tensors, versions = [], []
    for t in (*root.parameters(), *root.buffers()):
        try:
            versions.append(int(t._version))
        except RuntimeError:  # an inference tensor has no version counter
            continue
        tensors.append(t)
    try:
        yield
    finally:
        setter = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)
        if setter is not None and tensors:
            try:
                setter(tuple(tensors), tuple(versions))
            except TypeError:  # torch before 2.5: one tensor a call
                for t, v in zip(tensors, versions, strict=True):
                    setter(t, v)


def _default_loss(outputs: Any, inputs: Any) -> torch.Tensor | None:
    loss = getattr(outputs, "loss", None)
    if loss is None and isinstance(outputs, dict):
        loss = outputs.get("loss")
    if loss is None and isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
        loss = outputs.reshape(())
    return loss if isinstance(loss, torch.Tensor) else None


def _replay_calls(
    model: nn.Module, f: ReplayFile, kept: KeptStep, loss_fn: Callable | None, named: dict[str, nn.Module]
) -> list[float]:
    """Each kept call of the step, forward then backward, as it began then; the losses."""
    losses = []
    for i, call in enumerate(kept.calls):
        tensors = f.tensors(f"s{kept.step}/c{i}/")
        tensors = {f"s{kept.step}/c{i}/{k}": t for k, t in tensors.items()}
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        args = _to(rebuild(call.args, tensors, f.path.name), device)
        kwargs = _to(rebuild(call.kwargs, tensors, f.path.name), device)
        if not isinstance(args, list | tuple) or not isinstance(kwargs, dict):
            raise InspectorError(
                f"{f.path.name}: a call's arguments are not a list and a dict; the file is forged"
            )
        for name, m in named.items():
            m.training = name not in call.eval_modules
        torch.set_rng_state(tensors[call.rng["cpu"]])
        for dev, key in call.rng.items():
            if (
                dev.startswith("cuda")
                and torch.cuda.is_available()
                and int(dev[4:]) < torch.cuda.device_count()
            ):
                torch.cuda.set_rng_state(tensors[key], int(dev[4:]))
        with ExitStack() as amp:
            for dev, dtype in call.autocast.items():
                amp.enter_context(torch.autocast(dev, dtype=getattr(torch, dtype)))
            with torch.enable_grad():
                outputs = model(*args, **kwargs)
                fn = loss_fn or _default_loss
                loss = fn(outputs, as_inputs(tuple(args), kwargs))
        if loss is None:
            continue
        losses.append(float(loss.detach().float()))
        if loss.requires_grad:
            loss.backward()
    return losses


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


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
