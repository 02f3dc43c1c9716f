"""Mutation watch: which captured live outputs were written in place after their copy.

Every captured tensor leaf is held only weakly, with its version counter (tensors made
outside inference mode) and the address of its storage: capturing keeps no activation
alive longer than the model does. A view keeps its base tensor object alive, so a write
through a view of a captured output is still seen.

- With a version counter, a module whose output or top-level inputs share a watched
  storage notes a write when the version moved (O(1) per tensor it touched), and values
  are compared only where the version moved: at once on the CPU; on a GPU after the pass
  (no synchronisation inside the forward), the written tensor then being held to the end.
  At the end every output still alive is checked once more, so a write outside any
  module is seen too.
- Inference tensors have no version counter: a live output is compared with its copy
  when a later module returns a tensor on the same storage (which is how in-place
  writers such as ``ReLU(inplace=True)`` or a returned ``x += ...`` show themselves).

Watching an output ends when its tensor object is gone: nothing can read it any more
(its memory may then be reused, which a copy does not mind).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from ..utils.findings import Finding
from .compare import max_abs_change
from .leaves import top_tensors
from .results import Mutation


class Live:
    """One captured output tensor leaf, watched for in-place changes.

    Captures of one tensor object whose copies are known to hold the same values (taken at
    the same version, or both found equal to the live tensor at one moment) are one watch:
    the later ones point at the first (``leader``) and only the first is compared. A chain of
    in-place or pass-through modules, each handing the same tensor on, then costs one
    comparison per module, not one per earlier capture.
    """

    # a class of its own rather than a dataclass: one is made per captured tensor, in the hook
    __slots__ = ("key", "path", "ref", "copy", "version", "source", "change", "by", "written_by", "hold",
                 "at", "leader", "fresh", "late")

    def __init__(self, key: str, path: str, ref: Callable[[], torch.Tensor | None], copy: torch.Tensor,
                 version: int | None, source: torch.device) -> None:
        self.key, self.path, self.ref, self.copy, self.version, self.source = (
            key,
            path,
            ref,
            copy,
            version,
            source,
        )
        self.change: float | None = None
        self.by: str | None = None
        self.written_by: list[str | None] | None = None  # the first writer that left the values as they were
        self.hold: torch.Tensor | None = None
        self.at: int | None = version  # the version (or, without one, the touch) the copy is known equal at
        self.leader: Live | None = None    # the watch this capture joined
        self.fresh: list[Live] | None = None  # captures that joined since this watch last noted a writer
        self.late = False                  # the change was found after the pass


def storage_key(t: torch.Tensor) -> int | None:
    """The address where ``t``'s storage starts; None where it has none (empty, meta, sparse).

    One call into torch (the storage's own address), which costs less than reading the
    tensor's address, offset and element size: this runs in the hooks."""
    if t.layout != torch.strided:
        return None
    try:
        return t.untyped_storage().data_ptr() or None
    except (RuntimeError, NotImplementedError, TypeError):
        return None


def live_record(key: str, path: str, t: torch.Tensor, copy: torch.Tensor) -> Live:
    """A weak record of ``t`` (with its version when it has one) and its copy."""
    version = None if t.is_inference() else t._version
    return Live(key, path, weakref.ref(t), copy, version, t.device)


class Watcher:
    """The watched outputs of one capture, indexed by storage address."""

    def __init__(self) -> None:
        self.live: list[Live] = []
        self.by_storage: dict[int, list[Live]] = {}   # the leading watches on each storage
        self.latest: dict[int, Live] = {}             # id(tensor) -> its most recent leading watch
        self.versioned = False   # whether any watched tensor has a version counter
        self.tick = 0            # counts the touches (inference tensors: when a copy was last equal)

    def add(self, rec: Live, skey: int, t: torch.Tensor) -> None:
        """Watch ``rec`` of the live tensor ``t``, whose storage starts at ``skey``."""
        if rec.version is not None:
            self.versioned = True
        self.live.append(rec)
        lead = self.latest.get(id(t))
        if lead is not None and lead.change is None and lead.hold is None and lead.ref() is t and (
                lead.at == (rec.version if rec.version is not None else self.tick)):
            rec.leader = lead  # the same tensor, the same values as that watch's copy
            if rec.version is not None:  # its first writer is the next one the lead notes
                _pending(lead, [rec])
            return
        self.latest[id(t)] = rec
        recs = self.by_storage.get(skey)
        if recs is None:
            self.by_storage[skey] = [rec]
        else:
            recs.append(rec)

    def track(self, key: str, path: str, t: torch.Tensor, copy: torch.Tensor) -> None:
        """Watch the live tensor ``t`` whose copy is ``copy`` (nothing for empty or meta tensors)."""
        skey = storage_key(t)
        if skey is not None:
            self.add(live_record(key, path, t, copy), skey, t)

    def touched(self, name: str, args: Any, kwargs: Any, output: Any) -> None:
        """Module ``name`` returned ``output`` from ``args``/``kwargs``: note the watched
        outputs it wrote in place (O(1) per top-level tensor it touched, amortised).

        Only tensors with version counters tell a write through an input; inference tensors
        are compared when a module hands their storage back.
        """
        self.tick += 1
        by_storage = self.by_storage
        values = (output, args, kwargs) if self.versioned else (output,)
        for i, value in enumerate(values):
            for t in ((value,) if type(value) is torch.Tensor else top_tensors(value)):
                skey = storage_key(t)
                recs = by_storage.get(skey) if skey is not None else None
                if recs:
                    self._seen(recs, name, i == 0)

    def _seen(self, recs: list[Live], name: str, is_output: bool) -> None:
        if len(recs) == 1:  # the common case: nothing to join
            if self._check(recs[0], name, is_output) is None:
                recs.clear()
            return
        kept: list[Live] = []
        synced: dict[int, Live] = {}
        for rec in recs:
            live = self._check(rec, name, is_output)
            if live is None:
                continue
            if rec.at == (rec.version if rec.version is not None else self.tick):
                lead = synced.setdefault(id(live), rec)
                if lead is not rec:  # both equal to the live tensor now: one watch from here on
                    rec.leader = lead
                    if rec.version is not None:
                        _pending(lead, [m for m in (rec.fresh or ()) if not m.written_by]
                                 + ([] if rec.written_by else [rec]))
                        rec.fresh = None
                    continue
            kept.append(rec)
        if len(kept) != len(recs):
            recs[:] = kept

    def _check(self, rec: Live, name: str, is_output: bool) -> torch.Tensor | None:
        """Look at one watch after module ``name`` ran; its live tensor, or None when there is
        nothing left to watch (gone, changed, or held for a comparison after the pass)."""
        live = rec.ref()
        if live is None:  # gone (its memory may be reused): nothing left to watch
            return None
        if rec.version is not None:
            if live._version != rec.version:
                rec.version = live._version
                if rec.source.type == "cuda":  # compared after the pass: no synchronisation now
                    rec.hold = live
                    _note_writer(rec, name)
                    return None
                compare(rec, live, name)  # now: the tensor may be gone by the end of the pass
                if rec.change is None:
                    rec.at = rec.version
        elif is_output:
            compare(rec, live, name)
            if rec.change is None:
                rec.at = self.tick
        return None if rec.change is not None else live

    def settle(
        self, mutated: dict[str, str | None], mutations: list[Mutation], findings: list[Finding]
    ) -> None:
        """After the pass: compare what was written, and add what changed to the recorder's
        ``mutated``, ``mutations`` and ``findings`` (collected before the result is built)."""
        for rec in self.live:
            lead = _leader(rec)
            if lead is not rec:
                _follow(rec, lead)
            else:
                t = rec.ref()
                if rec.change is None and t is not None and rec.version is not None:
                    _settle_versioned(rec, t)
                    rec.late = rec.change is not None
            if rec.change is None and rec.written_by:
                by = rec.written_by[0]
                findings.append(Finding("capture-written-same-values", "info", rec.key,
                                        f"{rec.key}{rec.path} was written in place"
                                        f"{' by ' + by if by else ''} after its capture, "
                                        "but its values did not change"))
            if rec.change is not None:
                _report(rec, mutated, mutations, findings)
        self.live.clear()
        self.by_storage.clear()
        self.latest.clear()


def _pending(lead: Live, recs: list[Live]) -> None:
    if recs:
        if lead.fresh is None:
            lead.fresh = recs
        else:
            lead.fresh.extend(recs)


def _leader(rec: Live) -> Live:
    while rec.leader is not None:
        rec = rec.leader
    return rec


def _follow(rec: Live, lead: Live) -> None:
    """A capture that joined ``lead`` shares its fate: what changed it changed this one too."""
    if lead.change is not None:
        rec.change = lead.change
        # a change found after the pass is named by this capture's own first writer, as for a lead
        rec.by = (rec.written_by[0] if rec.written_by else None) if lead.late else lead.by


def _note_writer(rec: Live, by: str | None) -> None:
    """Keep the first writer (the one a finding names); captures that joined this watch since
    it last noted one get this one as their first."""
    if not rec.written_by:
        rec.written_by = [by]
    if rec.fresh:
        for member in rec.fresh:
            if not member.written_by:
                member.written_by = [by]
        rec.fresh = None


def compare(rec: Live, t: torch.Tensor, by: str | None) -> None:
    """Compare the live tensor with its copy now; note a change and who made it."""
    if rec.source.type == "cuda":
        torch.cuda.synchronize(rec.source)  # the copy may still be in flight
    change = max_abs_change(t, rec.copy)
    if change is None:
        return
    if change != 0.0:
        rec.change, rec.by = change, by
    elif rec.version is not None:
        _note_writer(rec, by)


def _settle_versioned(rec: Live, t: torch.Tensor) -> None:
    if t._version != rec.version:  # written after the last module that touched it
        _note_writer(rec, None)
    rec.fresh = None  # not written since they joined (else noted just above)
    if rec.written_by:  # one comparison, after the pass; the first writer is named
        writers, rec.written_by = rec.written_by, []
        compare(rec, t, writers[0])
        if rec.change is None:
            rec.written_by = writers


def _report(rec: Live, mutated: dict[str, str | None], mutations: list[Mutation],
            findings: list[Finding]) -> None:
    change = rec.change
    mutations.append(
        Mutation(rec.key, rec.path, rec.by, "value" if rec.version is None else "version", change)
    )
    if rec.key in mutated:
        return
    mutated[rec.key] = rec.by
    by = f"by {rec.by}" if rec.by else "after the forward pass or outside any module"
    findings.append(Finding(
        "capture-mutated", "warning", rec.key,
        f"the live output of {rec.key} was overwritten in place {by} after the hook saw it "
        f"(largest change {change:.4g}); a hook that kept a bare reference would hold the "
        "overwritten values. The capture is a copy taken before."))
