"""The ranks of a watched run meet at each step, with a timeout, and tell rank 0 how they ended.

Before the step's ``all_gather`` every rank publishes ``(step, training forward passes)`` under a
key of the process group's key-value store and waits up to ``timeout`` seconds for the other
ranks' keys. The store is not a collective and takes a timeout, so no collective starts until
every rank is at the same step: a rank that skipped ``w.step()`` or ran a batch it never stepped
(an exception caught after its forward pass) is named at once, a rank that stopped or vanished
when the timeout passes, instead of a hang.

A rank whose watch ends publishes how: completed, or failed (step, exception type and message).
A rank waiting at the meeting reads it and stops naming that rank; rank 0, which writes the run
file, records every other rank's failure as a ``run-failed`` finding on that rank's row when its
own watch ends. A rank that died without a word (SIGKILL, out of memory) is recorded as vanished
when rank 0's own watch ends on a communication error, or when the meeting's timeout passes.
"""

from __future__ import annotations

import json
import math
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.hooks import RemovableHandle

from ..utils.codes import coded
from ..utils.dtensors import default_store
from ..utils.findings import Finding, InspectorError
from ..utils.labels import ROOT_LABEL
from .layout import Layout
from .numbers import Numbers

_opened: dict[str, int] = {}  # group tag -> watches this process opened on it (the same on every rank)
POLL = 0.5


class RanksApart(InspectorError):
    """The ranks of a watched run are no longer at the same step: ``ranks`` named, ``finding`` the
    ``run-failed`` finding of the first of them."""

    def __init__(self, message: str, ranks: list[int], findings: dict[int, Finding]) -> None:
        super().__init__(message)
        self.ranks, self.findings = ranks, findings
        self.finding: Any = None  # the StepFinding of the first rank named, set where it is recorded


def _group_tag(group: Any) -> str:
    ranks = dist.get_process_group_ranks(group or dist.group.WORLD)
    return "inspector/watch/" + ",".join(str(r) for r in ranks)


def communication_error(error: BaseException) -> bool:
    """Whether ``error`` is a collective's failure (a peer gone), not the training code's own."""
    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(
        w in text for w in ("connection closed", "connection reset", "gloo", "nccl", "timed out", "peer"))


class Meeting:
    """One watch's meetings (a no-op without a store or with one rank)."""

    def __init__(self, group: Any, rank: int, world: int, timeout: float) -> None:
        self.rank, self.world, self.timeout = rank, world, timeout
        self.store = default_store() if world > 1 else None
        self.tag = ""
        self.last = -1
        if self.store is not None:
            tag = _group_tag(group)
            _opened[tag] = _opened.get(tag, 0) + 1
            self.tag = f"{tag}/{_opened[tag]}"

    def _key(self, what: str, rank: int) -> str:
        return f"{self.tag}/{what}/{rank}"

    def _get(self, what: str, rank: int) -> Any:
        key = self._key(what, rank)
        if self.store is None:
            return None
        try:
            return json.loads(self.store.get(key)) if self.store.check([key]) else None
        except Exception:  # noqa: BLE001 - a store whose host is gone reads as nothing
            return None

    def meet(self, step: int, forwards: int) -> None:
        """Wait for every rank at ``step``; raise :class:`RanksApart` naming the ranks that are not."""
        if self.store is None:
            return
        self.store.set(self._key(f"at/{step}", self.rank), str(forwards))
        others = [r for r in range(self.world) if r != self.rank]
        keys = [self._key(f"at/{step}", r) for r in others]
        deadline = time.monotonic() + self.timeout
        while True:
            began = time.monotonic()
            try:
                self.store.wait(keys, timedelta(seconds=max(0.001, min(POLL, deadline - time.monotonic()))))
                break
            except Exception:  # noqa: BLE001 - a slice of the wait passed (or the store's host is gone)
                if time.monotonic() - began < POLL / 2:  # the store failed at once: do not spin
                    time.sleep(min(POLL, max(0.0, deadline - time.monotonic())))
                ended = {r: e for r in others if (e := self._get("end", r)) is not None}
                if ended:
                    self._apart_ended(step, ended)
                if time.monotonic() >= deadline:
                    self._apart_late(step, others)
        store = self.store
        values = store.multi_get(keys) if hasattr(store, "multi_get") else [store.get(k) for k in keys]
        differ = {r: int(v) for r, v in zip(others, values, strict=True) if int(v) != forwards}
        if differ:
            self._apart_forwards(step, forwards, differ)
        if step > 0:
            try:
                self.store.delete_key(self._key(f"at/{step - 1}", self.rank))  # every rank is past it
            except Exception:  # noqa: BLE001 - only tidiness
                pass
        self.last = step

    def _last_step(self, r: int, step: int) -> int | None:
        for s in range(step, max(step - 64, -1), -1):
            if self._get(f"at/{s}", r) is not None:
                return s
        return None

    def _raise(self, ranks: list[int], text: dict[int, str], step: int) -> None:
        findings = {r: coded("run-failed", ROOT_LABEL, t) for r, t in text.items()}
        raise RanksApart(f"the watch on rank {self.rank} stopped at step {step}: " + "; ".join(text.values()),
                         ranks, findings)

    def _apart_ended(self, step: int, ended: dict[int, Any]) -> None:
        text = {}
        for r, e in ended.items():
            if e.get("failed"):
                text[r] = f"rank {r} failed at step {e['step']} ({e['failed']}); the others stopped with it"
            else:
                text[r] = (f"rank {r} left the watch after {e['step']} step(s) while rank {self.rank} was at "
                           f"step {step}: rank {r} skipped a step (every rank must make as many steps)")
        self._raise(sorted(text), text, step)

    def _apart_late(self, step: int, others: list[int]) -> None:
        text = {}
        for r in others:
            if self._get(f"at/{step}", r) is not None:
                continue
            s = self._last_step(r, step - 1)
            last = "made no step yet" if s is None else f"last reached step {s}"
            text[r] = (f"rank {r} did not reach step {step} within {self.timeout:g} s ({last}): it stopped, "
                       "hangs, was killed, or skipped a step")
        self._raise(sorted(text), text, step)

    def _apart_forwards(self, step: int, forwards: int, differ: dict[int, Any]) -> None:
        text = {}
        for r, f in differ.items():
            more, fewer = (r, self.rank) if f > forwards else (self.rank, r)
            text[more] = (f"rank {more} made {max(f, forwards)} training forward passes by step {step}, rank "
                          f"{fewer} {min(f, forwards)}: rank {more} ran a batch it did not step (an "
                          "exception caught after the forward pass?); every rank must run the same batches")
        self._raise(sorted(text), text, step)

    def ended(self, step: int, error: BaseException | None) -> None:
        """Tell the other ranks how this rank's watch ended (its failure, if any)."""
        if self.store is None:
            return
        failed = "" if error is None else f"{type(error).__name__}: {str(error).strip()[:300]}"
        try:
            self.store.set(self._key("end", self.rank), json.dumps({"step": step, "failed": failed}))
        except Exception:  # noqa: BLE001 - the host of the store (rank 0) is gone: nobody to tell
            pass

    def failures(self, step: int, error: BaseException | None, grace: float = 3.0) -> dict[int, Finding]:
        """On rank 0 at its end: every other rank's failure as a ``run-failed`` finding. When this rank's own
        ``error`` is a collective's failure, a rank that sent no word within ``grace`` seconds vanished."""
        if self.store is None or self.rank != 0:
            return {}
        others = [r for r in range(self.world) if r != self.rank]
        lost = error is not None and communication_error(error) and not isinstance(error, RanksApart)
        deadline = time.monotonic() + (grace if lost else 0.0)
        while True:
            ended = {r: e for r in others if (e := self._get("end", r)) is not None}
            if len(ended) == len(others) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        out = {}
        for r in others:
            e = ended.get(r)
            if e is not None and e.get("failed"):
                out[r] = coded("run-failed", ROOT_LABEL,
                                 f"rank {r} failed at step {e['step']} by {e['failed']}")
            elif e is None and lost:
                at = self._last_step(r, step)
                last = f"last seen at step {at}" if at is not None else "seen at no step"
                out[r] = coded("run-failed", ROOT_LABEL,
                                 f"rank {r} vanished ({last}) without an exception of its own: killed by "
                                 "a signal, out of memory, or its machine lost; rank 0's collective failed")
        return out


def gather_numbers(numbers: Numbers, layout: Layout, world: int, group: Any) -> list[Numbers]:
    """Every rank's numbers of this step, on every rank (one ``all_gather`` of one vector)."""
    if world == 1:
        return [numbers]
    device = torch.device("cpu")
    if "nccl" in str(dist.get_backend(group)).lower() and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    moved = numbers.pack().to(device)
    out = [torch.empty_like(moved) for _ in range(world)]
    dist.all_gather(out, moved, group=group)
    sizes = len(layout.modules), len(layout.parameters), len(layout.buffers)
    return [Numbers.unpack(o.cpu().numpy(), *sizes) for o in out]


def merge_findings(own: list[Finding], numbers_all: list[Numbers], world: int,
                   group: Any) -> list[list[Finding]]:
    """Every rank's findings (``own`` here), on every rank: one object gather, only at a step where a
    rank has some (``Numbers.shared``)."""
    if world == 1:
        return [own]
    if not any(n.shared for n in numbers_all):
        return [[] for _ in numbers_all]
    box: list[Any] = [None] * world
    dist.all_gather_object(box, [f.to_dict() for f in own], group=group)
    return [[Finding(**d) for d in b] for b in box]


class ComputeClock:
    """A rank's own time before the step's first collective: from the step's start to the end of its
    first forward pass (to the forward's call under FSDP2 / tensor parallel, whose forward gathers;
    the call of the outer wrapper comes before DDP's buffer broadcast)."""

    def __init__(self, sharded: bool) -> None:
        self.sharded = sharded
        self.called = self.forwarded = math.nan

    def attach(self, model: nn.Module, root: nn.Module) -> list[RemovableHandle]:
        return [model.register_forward_pre_hook(self._call), root.register_forward_hook(self._end)]

    def _call(self, module: nn.Module, args: Any) -> None:
        if math.isnan(self.called):
            self.called = time.perf_counter()

    def _end(self, module: nn.Module, args: Any, output: Any) -> None:
        if math.isnan(self.forwarded):
            self.forwarded = time.perf_counter()

    def take(self, start: float) -> float:
        """Seconds since ``start`` (NaN without a forward pass this step); starts the next step's."""
        end = self.called if self.sharded else self.forwarded
        self.called = self.forwarded = math.nan
        return end - start


def slow_ranks(times: list[float], at_least: float = 1.0, factor: float = 3.0) -> list[tuple[int, Finding]]:
    """``slow-rank`` for each rank whose time before the step's first collective (``times``, one per
    rank) is ``at_least`` seconds and ``factor`` times over the median of the other ranks'."""
    out = []
    for r, t in enumerate(times):
        others = sorted(v for i, v in enumerate(times) if i != r and v == v)
        if t != t or not others:
            continue
        middle = others[len(others) // 2] if len(others) % 2 else (others[len(others) // 2 - 1]
                                                                   + others[len(others) // 2]) / 2
        if t - middle >= at_least and t >= factor * middle:
            out.append((r, coded(
                "slow-rank", ROOT_LABEL,
                f"rank {r} took {t:.3g} s to load its batch and run its forward pass at this step, the other "
                f"ranks {middle:.3g} s: every rank waited for it in the step's first collective, so the step "
                "time is the same everywhere. Look at that rank's data loader, its batch sizes and its "
                "machine")))
    return out


__all__ = ["Meeting", "RanksApart", "communication_error", "slow_ranks"]
