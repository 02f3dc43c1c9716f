"""``StepKeeper``: what a watch keeps of its last steps so that one of them can be run again.

The watch calls it at five points (nothing else of the watch is read here)::

    keeper = StepKeeper(root, "run.inspect", steps=2)
    handles = keeper.attach()          # when the watch opens: a forward pre-hook on the root
    keeper.weights(grad_parts, loss)   # in the optimizer's pre-step hook, before the update
    keeper.finding(step_finding)       # each new finding
    keeper.step_starts(step)           # after the optimizer's step: the next step begins
    keeper.close()                     # when the watch closes

On every training forward (grad on, root in training mode) the pre-hook keeps a *reference* to the
call's arguments, the generators' states (CPU, and CUDA's where initialised: a few bytes each), the
autocast state and the modules in eval mode. Nothing is copied on a healthy step. In the pre-step
hook the gradient norms the watch just computed (and the logged loss) come to the host in one
transfer; a NaN/Inf among them, or a parameter's gradient norm ``explode_factor`` times its median
(after ``WARM_UP`` steps, and over its noise), copies the weights and buffers to the host, before
the optimizer changes them. ``keep_weights=True`` copies them at every step instead (their size,
every step, on the host: the cost is the copy).

When a step ends that had an error finding (or ``exploding-gradient``), a replay file (:mod:`.files`)
is written next to the run file with the kept steps (one per episode: not again until ``QUIET`` steps
have passed without an error finding; only when some kept step has its weights), within ``max_bytes``
for the whole run; what the budget or the batch's contents left out is listed in
:attr:`StepKeeper.notes`.
"""

from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..utils.dtensors import is_dtensor
from ..utils.findings import InspectorError
from .calls import Unkeepable, flatten
from .files import KeptCall, KeptStep, ReplayMeta, remove_replay_files, replay_path, write_replay

WARM_UP = 10  # steps of gradient norms seen before one is judged exploding
NOISE = 7.0  # ... and it must be over its median by this many median absolute deviations (log scale)
HISTORY = 50
QUIET = 5  # steps without an error finding that end an episode (the watch's recur_after)
DEFAULT_BYTES = 1 << 30
TRIGGERS = ("exploding-gradient",)  # a warning found before the update, like the errors: its step is kept


@dataclass
class _Call:
    args: Any
    kwargs: Any
    rng: dict[str, torch.Tensor]
    autocast: dict[str, str]
    eval_modules: tuple[str, ...]
    tensors: dict[str, torch.Tensor]  # t0, t1, ...: references to the call's own tensors
    versions: list[int]  # each one's version counter then (a later in-place write moves it)
    own: torch.Tensor | None = None  # the model's own loss (``outputs.loss``), detached: read when written


@dataclass
class _Step:
    step: int
    calls: list[_Call] = field(default_factory=list)
    weights: dict[str, torch.Tensor] | None = None
    buffers: dict[str, torch.Tensor] | None = None
    loss: float | None = None
    findings: list[tuple[str, str, str, str]] = field(default_factory=list)
    unkept: str = ""  # why this step's calls cannot be kept


class StepKeeper:
    """Keeps the last ``steps`` steps of a watched run so that one can be replayed.

    Args:
        root: the model the watch follows (wrappers seen through).
        run_path: the run file; replay files go next to it.
        steps: how many recent steps are kept (2: the step that broke and the one before).
        keep_weights: copy the weights to the host at every step (else only when a pre-step error
            is seen: non-finite gradients or loss, an exploding gradient).
        max_bytes: the most bytes all replay files of the run may hold together.
        rank, world: this process's rank and the world size (each rank keeps its own).
        model: the model's name as the run file's metadata has it.
        explode_factor: a gradient norm over this many times its median counts as exploding.
    """

    def __init__(
        self,
        root: nn.Module,
        run_path: str | os.PathLike,
        *,
        steps: int = 2,
        keep_weights: bool = False,
        max_bytes: int = DEFAULT_BYTES,
        rank: int = 0,
        world: int = 1,
        model: str = "",
        explode_factor: float = 8.0,
    ) -> None:
        if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= 64:
            raise InspectorError(f"keep must be True or a number of steps from 1 to 64, got {steps!r}")
        if max_bytes < 0:
            raise InspectorError(f"keep_bytes must be 0 or more, got {max_bytes}")
        self.root, self.run_path, self.keep, self.keep_weights = root, Path(run_path), steps, keep_weights
        self.max_bytes, self.rank, self.world, self.model = max_bytes, rank, world, model
        self.explode_factor = explode_factor
        self.kept: deque[_Step] = deque(maxlen=steps)
        self.current = _Step(0)
        self.kept.append(self.current)
        self.history: deque[np.ndarray] = deque(maxlen=HISTORY)
        self.written: list[Path] = []
        self.notes: list[str] = []
        self.bytes = 0
        self.copies = 0  # steps whose weights were copied to the host
        self._pending = False
        self._last_error = -(QUIET + 1)  # the last step with an error finding
        self._modules: list[tuple[str, nn.Module]] = []

    # -- the watch's calls -----------------------------------------------------------------------
    def attach(self) -> list[RemovableHandle]:
        """Start keeping: this rank's replay files of an earlier run at the same path are removed, and a
        forward pre-hook goes on the root (the caller removes the handles it returns)."""
        if any(is_dtensor(p) for p in self.root.parameters()):
            raise InspectorError(
                f"keep=True on {self.model or 'this model'}: its parameters are DTensors (FSDP2 or tensor "
                "parallel), of which each rank holds a piece; a replay runs one process with whole tensors. "
                "Keep steps on a run of the model that is not sharded (one process, or DDP)")
        remove_replay_files(self.run_path, self.rank, self.world)
        self._modules = list(self.root.named_modules())
        return [self.root.register_forward_pre_hook(self._forward_starts, with_kwargs=True),
                self.root.register_forward_hook(self._forward_ends)]

    def _forward_starts(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if module.training and torch.is_grad_enabled():
            self.batch(args, kwargs)

    def _forward_ends(self, module: nn.Module, args: tuple, output: Any) -> None:
        """A training forward's own loss (a Hugging Face model's ``outputs.loss``), by reference: a stack
        that logs its loss after the update (the Trainer) still has the step's own to compare with."""
        calls = self.current.calls
        if calls and calls[-1].own is None and module.training and torch.is_grad_enabled():
            calls[-1].own = own_loss(output)

    def batch(self, args: tuple, kwargs: dict) -> None:
        """A training forward begins with ``args`` and ``kwargs``: keep references to them, the
        generators' states and the autocast state (a stack's integration may call this itself)."""
        st = self.current
        if st.unkept:
            return
        tensors: dict[str, torch.Tensor] = {}
        try:
            tree = (flatten(args, "t", tensors), flatten(kwargs, "t", tensors))
        except Unkeepable as exc:
            st.unkept, st.calls = str(exc), []
            return
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            rng.update({f"cuda{i}": torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())})
        autocast = {
            d: str(torch.get_autocast_dtype(d)).removeprefix("torch.")
            for d in ("cpu", "cuda")
            if torch.is_autocast_enabled(d)
        }
        eval_modules = tuple(n for n, m in self._modules if not m.training)
        versions = [_version(t) for t in tensors.values()]
        st.calls.append(_Call(tree[0], tree[1], rng, autocast, eval_modules, tensors, versions))

    def weights(self, grad_parts: list[tuple[np.ndarray, torch.Tensor]], loss: Any = None) -> bool:
        """Before the optimizer's update: copy the weights to the host when this step's gradient norms
        (``(indices, norms)`` pairs on the device, as the watch computed them) or ``loss`` hold NaN/Inf,
        or a norm explodes (always with ``keep_weights``). One transfer; returns whether they were kept."""
        st = self.current
        parts = [t.reshape(-1).float() for _, t in grad_parts]
        if isinstance(loss, torch.Tensor):
            parts.append(loss.detach().reshape(-1)[:1].float().to(parts[0].device if parts else loss.device))
        host = torch.cat([p.to("cpu") for p in parts]).numpy() if parts else np.zeros(0)
        width = sum(len(i) for i, _ in grad_parts)
        norms = np.full(max((int(i.max()) + 1 for i, _ in grad_parts if len(i)), default=0), np.nan)
        at = 0
        for idx, _ in grad_parts:
            norms[idx] = host[at : at + len(idx)]
            at += len(idx)
        value = (
            float(host[width])
            if isinstance(loss, torch.Tensor)
            else (float(loss) if isinstance(loss, (int, float)) else None)
        )
        st.loss = value
        bad = not bool(np.isfinite(host).all()) or self._explodes(norms)
        if (bad or self.keep_weights) and st.weights is None:
            st.weights = {n: p.detach().to("cpu", copy=True) for n, p in self.root.named_parameters()}
            st.buffers = {n: b.detach().to("cpu", copy=True) for n, b in self.root.named_buffers()}
            self.copies += 1
        return st.weights is not None

    def _explodes(self, norms: np.ndarray) -> bool:
        with np.errstate(all="ignore"):
            now = np.where(norms > 0, np.log(np.where(norms > 0, norms, 1.0)), np.nan)
        past = [h for h in self.history if len(h) == len(now)]
        self.history.append(now)
        if len(past) < WARM_UP:
            return False
        a = np.asarray(past)
        with np.errstate(all="ignore"):
            median, count = _median(a)
            mad, _ = _median(np.abs(a - median))
            threshold = np.maximum(math.log(self.explode_factor), NOISE * mad)
            over = (count >= WARM_UP) & (now - median > threshold)
        return bool(over.any())

    def finding(self, f: Any) -> None:
        """A new finding of the watch (a :class:`~inspector.runfiles.StepFinding`): an error (or an
        exploding gradient) at the current step makes a replay file when the step ends."""
        step = getattr(f, "step", None)
        if step != self.current.step:
            return
        self.current.findings.append((f.code, f.severity, f.where, f.message))
        if f.severity == "error" or f.code in TRIGGERS:
            # one file per episode: errors in the steps that follow one (its NaN weights, ...) start none
            self._pending = self._pending or step - self._last_error > QUIET
            self._last_error = step

    def step_starts(self, step: int) -> None:
        """The step before has ended (its findings are in): write its replay file if it had an error
        finding, then begin keeping ``step``."""
        self._flush()
        self.current = _Step(step)
        self.kept.append(self.current)

    def close(self) -> None:
        """The watch ends: write the last step's replay file if it had an error finding (a step that
        failed), and let go of every reference kept."""
        self._flush()
        self.kept.clear()
        self.current = _Step(-1)

    # -- writing ---------------------------------------------------------------------------------
    def _flush(self) -> None:
        if not self._pending:
            return
        self._pending = False
        st = self.current
        usable = [s for s in self.kept if s.calls and s.weights is not None]
        if st.unkept:
            self.notes.append(f"step {st.step}: not kept, {st.unkept}")
            return
        if not usable:
            self.notes.append(
                f"step {st.step}: its error finding came after the optimizer's update, with no weights kept "
                "from before it; keep_weights=True keeps every step's weights"
            )
            return
        tensors: dict[str, torch.Tensor] = {}
        steps = []
        for s in self.kept:
            if not s.calls or s.unkept:
                continue
            calls = []
            for i, c in enumerate(s.calls):
                prefix = f"s{s.step}/c{i}/"
                args, kwargs = _renamed(c.args, prefix), _renamed(c.kwargs, prefix)
                tensors.update({prefix + k: t for k, t in c.tensors.items()})
                rng = {dev: f"{prefix}rng/{dev}" for dev in c.rng}
                tensors.update({f"{prefix}rng/{dev}": t for dev, t in c.rng.items()})
                written = tuple(
                    k for (k, t), v in zip(c.tensors.items(), c.versions, strict=True) if _version(t) != v
                )
                own = float(c.own.float()) if c.own is not None else None  # a sync, on a kept step only
                calls.append(KeptCall(args, kwargs, rng, c.autocast, c.eval_modules, written, own))
            if s.weights is not None and s.buffers is not None:
                tensors.update({f"s{s.step}/w/{n}": t for n, t in s.weights.items()})
                tensors.update({f"s{s.step}/b/{n}": t for n, t in s.buffers.items()})
            steps.append(KeptStep(s.step, tuple(calls), s.weights is not None, s.loss))
        size = sum(t.numel() * t.element_size() for t in tensors.values())
        if self.bytes + size > self.max_bytes:
            self.notes.append(
                f"step {st.step}: its replay file ({size:,} bytes) would pass keep_bytes "
                f"({self.max_bytes:,}, {self.bytes:,} used); not written"
            )
            return
        first = usable[0]
        meta = ReplayMeta(
            self.run_path.name,
            self.model,
            self.rank,
            self.world,
            tuple(first.weights or ()),
            tuple(first.buffers or ()),
            st.step,
            tuple(st.findings),
            tuple(steps),
        )
        try:
            path = write_replay(replay_path(self.run_path, st.step, self.rank, self.world), meta, tensors)
        except InspectorError as exc:  # a full disk must not stop the training it watches
            self.notes.append(f"step {st.step}: {exc}")
            return
        self.bytes += size
        self.written.append(path)


def own_loss(output: Any) -> torch.Tensor | None:
    """The loss a model returns itself (``outputs.loss``, ``outputs["loss"]``) when it is one number,
    detached; else None."""
    loss = getattr(output, "loss", None)
    if loss is None and isinstance(output, dict):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.is_floating_point():
        return loss.detach()
    return None


def _median(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The median of each column of ``a`` over its non-NaN values (NaN where none) and their count, by one
    sort (``np.nanmedian`` costs milliseconds a call on small arrays, and warns on a column of NaN)."""
    count = np.isfinite(a).sum(axis=0)
    ordered = np.sort(a, axis=0)  # NaN last
    low = np.take_along_axis(ordered, np.maximum((count - 1) // 2, 0)[None], axis=0)[0]
    high = np.take_along_axis(ordered, np.minimum(count // 2, len(a) - 1)[None], axis=0)[0]
    return np.where(count > 0, (low + high) / 2, np.nan), count


def _version(t: torch.Tensor) -> int:
    try:
        return int(t._version)
    except RuntimeError:  # an inference tensor has no version counter
        return -1


def _renamed(node: Any, prefix: str) -> Any:
    """The tree with each tensor key ``tN`` written as ``prefix + tN``."""
    if isinstance(node, dict):
        if "t" in node:
            return {"t": prefix + node["t"]}
        return {k: _renamed(v, prefix) for k, v in node.items()}
    if isinstance(node, list):
        return [_renamed(v, prefix) for v in node]
    return node
