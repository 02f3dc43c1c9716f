"""The ranks of a watched run check in before each collective of a step, with a timeout, and tell the
others how they ended.

Every rank checks in at two places of each step: when a training forward pass of the model begins (a
forward pre-hook of the model as given, so before DDP's buffer broadcast, FSDP's all-gather and the
backward's gradient all-reduce), and when the step begins (the optimizer's pre-step hook or
``w.step()``, before the watch's own ``all_gather``). The N-th check-in publishes ``(N, kind, step,
training forward passes)`` under one of two keys of this rank in the process group's key-value store and
waits up to ``timeout`` seconds for the other ranks' N-th. The store is not a collective: no rank starts
a collective the others will not join. Where the ranks' N-th check-ins differ, the rank out of step is
named at once: a rank that began a forward pass where the others stepped skipped ``optimizer.step()``
(its backward ran) or ran an extra forward pass (no backward after its last one); a rank that left the
watch with fewer batches skipped a batch; a rank whose model differs (its first check-in carries the
trainable parameters' names) watches another model. A rank that does not come within
``timeout`` seconds is named as late (it joined late, stopped, hangs or vanished); when this rank began
a forward pass with no backward after its last one and the others stayed at that forward pass, this rank
is named: the others wait in the collective of the backward it skipped.

The wait looks at the store (``check``, no exception, nothing logged) every few milliseconds, so signals
are handled while it waits and c10d prints nothing. A rank that stops (out of step, failed, completed)
writes how it ended over its next check-in and under ``end``: a rank that comes to that check-in later
reads it and stops naming the same ranks; rank 0, which writes the run file, records every other rank's
failure as a ``run-failed`` finding on that rank's row when its own watch ends. A rank that died without
a word (SIGKILL, out of memory) is named at once by the ranks waiting for it on the same machine: each
rank publishes its process id, with its host, boot and PID namespace, when its watch opens, and a rank
that waits longer than ``VANISHED_AFTER`` looks whether the process of each rank it waits for still runs
(a process that ended, or a zombie, has vanished). Elsewhere (another machine, another container) it is
recorded as vanished when rank 0's own watch ends on a communication error, or when the check-in's
timeout passes.

Whether a process still runs is :mod:`.processes`; a step's numbers and findings gathered across the
ranks, :mod:`.gather`; each rank's time before the step's first collective and ``slow-rank``,
:mod:`.clock` (their ``gather_numbers``, ``merge_findings``, ``ComputeClock`` and ``slow_ranks`` are
handed on here).
"""

from __future__ import annotations

import json
import math
import os
import time
import zlib
from itertools import repeat
from typing import Any

import torch.distributed as dist
from torch import nn

from ..utils.codes import coded
from ..utils.dtensors import default_store
from ..utils.findings import Finding, InspectorError
from ..utils.labels import ROOT_LABEL
from .clock import ComputeClock as ComputeClock
from .clock import slow_ranks
from .gather import gather_numbers as gather_numbers
from .gather import merge_findings as merge_findings
from .layout import Layout, current
from .processes import _SPACE, _alive

_opened: dict[str, int] = {}  # group tag -> watches this process opened on it (the same on every rank)
POLL = 0.5  # the pause after a store that failed at once
AT_ONCE = 2e-4  # seconds a check-in asks again at once: each look costs both this rank and the store's host
PAUSE = 0.01  # the longest pause between two looks at the store while a check-in waits
VANISHED_AFTER = 0.5  # seconds a check-in waits before it looks whether the ranks it waits for still run


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


def model_key(root: nn.Module, layout: Layout) -> dict[str, Any]:
    """What every rank's model must share: its trainable parameters' count and a checksum of their names
    (``numel``, their elements here, is for the message only: FSDP with ``use_orig_params=True`` shows each
    rank its own piece of a parameter, so shapes may differ between ranks of one model; DDP checks the
    shapes itself when it wraps the model)."""
    params = current(root, layout.parameters)
    shapes = [tuple(p.shape) if p is not None else () for p in params]
    return {"n": len(shapes), "numel": sum(math.prod(s) for s in shapes),
            "crc": zlib.crc32(";".join(layout.parameters).encode()) & 0xFFFFFFFF}


def _ranks(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ", ".join(str(r) for r in ranks)


def _where(v: dict[str, Any]) -> str:
    """A check-in in words."""
    if v["kind"] == "forward":
        return f"training forward pass {v['forwards'] + 1} (at step {v['step']})"
    return f"step {v['step']} (after {v['forwards']} training forward passes)"


def _model(m: dict[str, Any]) -> str:
    return f"{m['n']} trainable parameters of {m['numel']:,} elements"


class Meeting:
    """One watch's check-ins (a no-op without a store or with one rank)."""

    def __init__(self, group: Any, rank: int, world: int, timeout: float,
                 model: dict[str, Any] | None = None) -> None:
        self.rank, self.world, self.timeout = rank, world, timeout
        self.model = model or {}
        self.store = default_store() if world > 1 else None
        self.tag = ""
        self.k = 0  # the next check-in
        self.previous: dict[str, Any] | None = None  # this rank's last check-in
        self.apart: RanksApart | None = None  # once out of step, every later check-in raises it again
        self.others = [r for r in range(world) if r != rank]
        self.processes: dict[int, dict[str, Any]] = {}  # rank -> its process id and host, once read
        if self.store is not None:
            tag = _group_tag(group)
            _opened[tag] = _opened.get(tag, 0) + 1
            self.tag = f"{tag}/{_opened[tag]}"
            self.store.set(self._key("process", rank), json.dumps({"pid": os.getpid(), "space": _SPACE}))

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

    def _slot(self, k: int, rank: int) -> str:
        """The key of check-in ``k`` of ``rank``: two keys a rank, used in turn (a rank is never more than
        one check-in ahead of another, and each value carries its number)."""
        return self._key(f"at/{k % 2}", rank)

    def _read(self, k: int, rank: int) -> dict[str, Any] | None:
        v = self._get(f"at/{k % 2}", rank) if k >= 0 else None
        return v if v is not None and v.get("n") == k else None

    def check_in(self, kind: str, step: int, forwards: int, back: bool) -> None:
        """Check in (``kind``: ``"forward"`` or ``"step"``) and wait for every rank's check-in of the same
        number; raise :class:`RanksApart` naming the ranks out of step, failed or late."""
        if self.store is None:
            return
        if self.apart is not None:
            raise self.apart
        value: dict[str, Any] = {"n": self.k, "kind": kind, "step": step, "forwards": forwards, "back": back}
        if self.k == 0:
            value["model"] = self.model
        self.store.set(self._slot(self.k, self.rank), json.dumps(value))
        values = self._wait(value)
        ended = {r: v["end"] for r, v in values.items() if "end" in v}
        if ended:
            self._apart_ended(value, ended)
        self._compare({**values, self.rank: value}, value)
        self.previous = value
        self.k += 1

    def _wait(self, value: dict[str, Any]) -> dict[int, dict[str, Any]]:
        """Every other rank's check-in of this number (a look every few ms: no exception, no c10d
        warning), or :meth:`_apart_late` once the timeout passes."""
        k, store = self.k, self.store
        assert store is not None
        keys = [self._slot(k, r) for r in self.others]
        there = k >= 2  # every other rank wrote both its keys by now: read them without asking first
        deadline = began = time.monotonic()
        deadline += self.timeout
        pause, looked = 0.0, began
        number = b'{"n": %d,' % k  # how a check-in of this number begins (``json.dumps``, "n" first)
        while True:
            try:
                if there or store.check(keys):
                    there = True
                    raw = (store.multi_get(keys) if hasattr(store, "multi_get")
                           else [store.get(x) for x in keys])
                    if all(map(bytes.startswith, map(bytes, raw), repeat(number))):  # each rank's k-th:
                        return {r: json.loads(v) for r, v in zip(self.others, raw, strict=True)}
            except Exception:  # noqa: BLE001 - the store's host is gone: wait out the timeout
                pause = POLL
            now = time.monotonic()
            if now >= deadline:
                self._apart_late(value)
            if now - began > VANISHED_AFTER and now - looked > VANISHED_AFTER / 2:
                looked = now
                self._apart_vanished(value)
            if now - began > AT_ONCE:  # ask again at once, briefly (each look waits for the store's answer)
                time.sleep(min(pause, deadline - now))
                pause = min(PAUSE if now - began > 0.05 else 5e-4, max(pause * 2, 5e-5))

    def _raise(self, text: dict[int, str], value: dict[str, Any]) -> None:
        ranks = sorted(text)
        findings = {r: coded("run-failed", ROOT_LABEL, text[r]) for r in ranks}
        self.apart = RanksApart(f"the watch on rank {self.rank} stopped at step {value['step']}: "
                                + "; ".join(text[r] for r in ranks), ranks, findings)
        self._publish(value["step"], value["forwards"], "", text)
        raise self.apart

    def _apart_ended(self, value: dict[str, Any], ended: dict[int, Any]) -> None:
        apart = {int(r): t for e in ended.values() for r, t in (e.get("apart") or {}).items()}
        if apart:  # another rank named the ranks out of step already: the same ranks, in the same words
            self._raise(apart, value)
        text = {}
        mine = value["forwards"] + (value["kind"] == "forward")
        for r, e in ended.items():
            if e.get("failed"):
                text[r] = f"rank {r} failed at step {e['step']} ({e['failed']}); the others stopped with it"
                continue
            what = ("a batch (no forward pass, no step: every rank must run as many batches)"
                    if e["forwards"] < mine else
                    "a step (optimizer.step() or w.step(): every rank must make as many)")
            text[r] = (f"rank {r} left the watch after {e['step']} step(s) and {e['forwards']} training "
                       f"forward pass(es) while rank {self.rank} went on to {_where(value)}: rank {r} "
                       f"skipped {what}")
        self._raise(text, value)

    def _apart_vanished(self, value: dict[str, Any]) -> None:
        """Raise for the ranks this check-in waits for whose process, on this machine, has ended."""
        gone = {}
        for r in self.others:
            if self._read(self.k, r) is not None:
                continue
            proc = self.processes.get(r) or self._get("process", r)
            if proc is None:
                continue
            self.processes[r] = proc
            if proc.get("space") == _SPACE and not _alive(int(proc.get("pid", -1))):
                at = self._last(r)
                last = f"last seen at {_where(at)}" if at is not None else "seen at no check-in"
                gone[r] = (f"rank {r} vanished ({last}): its process {proc['pid']} on this machine ended "
                           f"without a word while rank {self.rank} waited at {_where(value)} (killed by a "
                           "signal, out of memory, or os._exit)")
        if gone:
            self._raise(gone, value)

    def _apart_late(self, value: dict[str, Any]) -> None:
        missing = [r for r in self.others if self._read(self.k, r) is None]
        if not missing:  # they came just now
            return
        last = {r: self._read(self.k - 1, r) for r in missing}
        prev = self.previous
        point = ("kind", "step", "forwards")
        if (prev is not None and prev["kind"] == "forward" and not value["back"] and all(
                v is not None and [v[x] for x in point] == [prev[x] for x in point] for v in last.values())):
            wait = "it waits" if len(missing) == 1 else "they wait"
            text = {self.rank: (
                f"rank {self.rank} ran an extra training forward pass: after {_where(prev)} it ran no "
                f"backward pass and went on to {_where(value)}, while {_ranks(missing)} did not come within "
                f"{self.timeout:g} s: {wait} in a collective of the backward pass rank {self.rank} skipped "
                "(DDP's gradient all-reduce). Every rank must run the same batches (an exception caught "
                "after the forward pass?)")}
            self._raise(text, value)
        text = {}
        for r in missing:
            if last[r] is None:
                text[r] = (f"rank {r} made no check-in within {self.timeout:g} s of rank {self.rank}'s first "
                           f"({_where(value)}): it joined late (its watch opened later), watches another "
                           "loop, or hangs")
            else:
                text[r] = (f"rank {r} did not reach {_where(value)} within {self.timeout:g} s (its last: "
                           f"{_where(last[r] or value)}): it stopped, hangs (in a collective another rank "
                           "skipped?), vanished (killed, out of memory), or skipped a step")
        self._raise(text, value)

    def _compare(self, values: dict[int, dict[str, Any]], value: dict[str, Any]) -> None:
        """Raise naming the ranks whose check-in differs from the others' (the most ranks agreeing; between
        as many, the ranks further on, or rank 0's model)."""
        if self.k == 0:
            models = {r: json.dumps({k: x for k, x in v.get("model", {}).items() if k != "numel"},
                                    sort_keys=True) for r, v in values.items()}
            ref = _reference(models, lambda m: -min(r for r, v in models.items() if v == m))
            if len(set(models.values())) > 1:
                who = _ranks(sorted(r for r, m in models.items() if m == ref))
                theirs = values[min(r for r, m in models.items() if m == ref)]["model"]
                self._raise({r: (f"rank {r} watches another model than {who}: {_model(values[r]['model'])} "
                                 f"against {_model(theirs)} (or other parameter names); every rank must "
                                 "watch the same model") for r, m in models.items() if m != ref}, value)
        keys = {r: (v["kind"], v["step"], v["forwards"]) for r, v in values.items()}
        if len(set(keys.values())) == 1:
            return
        ref = _reference(keys, lambda k: (k[1], k[0] == "step", -k[2]))
        on = sorted(r for r, k in keys.items() if k == ref)
        there = values[on[0]]
        text = {}
        for r, v in values.items():
            if keys[r] == ref:
                continue
            behind = (v["step"], v["kind"] == "step") < (there["step"], there["kind"] == "step")
            if behind and v["kind"] == "forward" and v["back"]:
                text[r] = (f"rank {r} skipped optimizer.step() (or w.step()) at step {v['step']}: its "
                           f"forward and backward passes ran, then it began {_where(v)} while {_ranks(on)} "
                           f"went on to {_where(there)}")
            elif behind and v["kind"] == "forward":
                text[r] = (f"rank {r} ran an extra training forward pass at step {v['step']}: it began "
                           f"{_where(v)} with no backward pass after its last one while {_ranks(on)} went on "
                           f"to {_where(there)} (a batch whose backward and step were skipped: an exception "
                           "caught after the forward pass?); every rank must run the same batches")
            elif not behind and (v["step"], v["kind"]) != (there["step"], there["kind"]):
                text[r] = (f"rank {r} went on to {_where(v)} while {_ranks(on)} began {_where(there)}: rank "
                           f"{r} made a step the others did not (or they skipped theirs)")
            else:
                text[r] = (f"rank {r} made {v['forwards']} training forward passes by step {v['step']}, "
                           f"{_ranks(on)} {there['forwards']}: every rank must run the same batches")
        self._raise(text, value)

    def _publish(self, step: int, forwards: int, failed: str, apart: dict[int, str] | None = None) -> None:
        """How this rank ended, over its pending check-in (a rank waiting there reads it) and under
        ``end``."""
        if self.store is None:
            return
        end = {"step": step, "forwards": forwards, "failed": failed,
               "apart": {str(r): t for r, t in (apart or {}).items()}}
        try:
            self.store.set(self._slot(self.k, self.rank), json.dumps({"n": self.k, "end": end}))
            self.store.set(self._key("end", self.rank), json.dumps(end))
        except Exception:  # noqa: BLE001 - the host of the store (rank 0) is gone: nobody to tell
            pass

    def ended(self, step: int, forwards: int, error: BaseException | None) -> None:
        """Tell the other ranks how this rank's watch ended (its failure, if any)."""
        if self.store is None or self.apart is not None:  # out of step: told already
            return
        failed = "" if error is None else f"{type(error).__name__}: {str(error).strip()[:300]}"
        self._publish(step, forwards, failed)

    def _last(self, r: int) -> dict[str, Any] | None:
        for k in (self.k, self.k - 1):
            v = self._read(k, r)
            if v is not None and "end" not in v:
                return v
        return None

    def failures(self, step: int, error: BaseException | None, grace: float = 3.0) -> dict[int, Finding]:
        """On rank 0 at its end: every other rank's failure as a ``run-failed`` finding, and the ranks another
        rank named out of step. When this rank's own ``error`` is a collective's failure, a rank that sent no
        word within ``grace`` seconds vanished."""
        if self.store is None or self.rank != 0:
            return {}
        lost = error is not None and communication_error(error) and not isinstance(error, RanksApart)
        deadline = time.monotonic() + (grace if lost else 0.0)
        while True:
            ended = {r: e for r in self.others if (e := self._get("end", r)) is not None}
            if len(ended) == len(self.others) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        out: dict[int, Finding] = {}
        for e in ended.values():
            for r, t in (e.get("apart") or {}).items():
                out.setdefault(int(r), coded("run-failed", ROOT_LABEL, t))
        for r in self.others:
            e = ended.get(r)
            if e is not None and e.get("failed"):
                out[r] = coded("run-failed", ROOT_LABEL,
                               f"rank {r} failed at step {e['step']} by {e['failed']}")
            elif e is None and lost:
                at = self._last(r)
                last = f"last seen at {_where(at)}" if at is not None else "seen at no check-in"
                out[r] = coded("run-failed", ROOT_LABEL,
                               f"rank {r} vanished ({last}) without an exception of its own: killed by "
                               "a signal, out of memory, or its machine lost; rank 0's collective failed")
        return out


def _reference(keys: dict[int, Any], further: Any) -> Any:
    """The value the most ranks hold; between as many, the one ``further`` ranks highest."""
    counts: dict[Any, int] = {}
    for k in keys.values():
        counts[k] = counts.get(k, 0) + 1
    return max(counts, key=lambda k: (counts[k], further(k)))


__all__ = ["Meeting", "RanksApart", "communication_error", "slow_ranks"]
