"""Before any collective: check that every rank is at the same ``check_step`` call, with a timeout.

``check_step`` is a collective: a rank that skips one call (an ``if rank == 0`` around it, an
exception caught on one rank) leaves the others waiting forever, or pairs their gather with
an unrelated collective of the training loop. So each call first swaps a small fingerprint
(the step, how many calls this rank made on this group, how many tensors it checks) through
the process group's key-value store, which is not a collective and takes a timeout. A rank
that does not arrive in time, or arrives with another fingerprint, is named in an
:class:`InspectorError` and no collective is started.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any, NoReturn

import torch.distributed as dist

from ..utils.dtensors import default_store
from ..utils.findings import InspectorError

_calls: dict[str, int] = {}   # group tag -> calls this process made on that group


def _tag(group: Any) -> str:
    if not (dist.is_available() and dist.is_initialized()):
        return "inspector/check/local"
    return "inspector/check/" + ",".join(
        str(r) for r in dist.get_process_group_ranks(group or dist.group.WORLD)
    )


def next_call(group: Any) -> int:
    """Count one more ``check_step`` call on ``group`` in this process; return its number (1, 2, ...)."""
    tag = _tag(group)
    _calls[tag] = _calls.get(tag, 0) + 1
    return _calls[tag]


def _read(store: Any, key: str) -> dict[str, int] | None:
    try:
        return json.loads(store.get(key)) if store.check([key]) else None
    except (RuntimeError, ValueError):
        return None


def _read_all(store: Any, keys: list[str]) -> list[dict[str, int] | None]:
    """The fingerprints under ``keys`` (which exist): one round trip where the store can."""
    try:
        values = store.multi_get(keys) if hasattr(store, "multi_get") else [store.get(k) for k in keys]
        return [json.loads(v) for v in values]
    except (RuntimeError, ValueError):
        return [_read(store, k) for k in keys]


def _last(store: Any, tag: str, r: int, call: int) -> dict[str, int] | None:
    """Rank ``r``'s latest fingerprint before ``call`` (each rank keeps its latest key)."""
    for earlier in range(call - 1, max(call - 64, 0), -1):
        found = _read(store, f"{tag}/{earlier}/{r}")
        if found is not None:
            return found
    return None


def agree(group: Any, rank: int, world: int, fingerprint: dict[str, int], timeout: float) -> None:
    """Publish this rank's fingerprint and wait up to ``timeout`` seconds for every other rank's.

    Raises:
        InspectorError: a rank did not arrive in time (named, with the last call it made), or a
            rank arrived with another step or tensor count.
    """
    store = default_store()
    if world == 1 or store is None:
        return
    tag, call = _tag(group), fingerprint["call"]
    store.set(f"{tag}/{call}/{rank}", json.dumps(fingerprint))
    others = [r for r in range(world) if r != rank]
    keys = [f"{tag}/{call}/{r}" for r in others]
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except (RuntimeError, dist.DistError):
        _late(store, tag, rank, others, fingerprint, timeout)
    seen = dict(zip(others, _read_all(store, keys), strict=True))
    differ = {r: f for r, f in seen.items() if f is not None and
              (f["step"], f["tensors"]) != (fingerprint["step"], fingerprint["tensors"])}
    if differ:
        where = "; ".join(f"rank {r} made it at step {f['step']} with {f['tensors']} tensors"
                          for r, f in differ.items())
        later = max([(f["step"], r) for r, f in differ.items()] + [(fingerprint["step"], rank)])[1]
        raise InspectorError(
            f"check_step call {call} on rank {rank} is at step {fingerprint['step']} with "
            f"{fingerprint['tensors']} tensors, but {where}. Every rank must call check_step at the same "
            f"steps on the same model: rank {later}, at the later step, skipped a call at an earlier step "
            "(or the ranks check different models). No collective was started.")
    if call > 1:
        store.delete_key(f"{tag}/{call - 1}/{rank}")  # every rank has read it: they all reached this call


def _late(store: Any, tag: str, rank: int, others: list[int], fingerprint: dict[str, int],
          timeout: float) -> NoReturn:
    call = fingerprint["call"]
    missing = [r for r in others if not store.check([f"{tag}/{call}/{r}"])]
    parts = []
    for r in missing:
        last = _last(store, tag, r, call)
        parts.append(f"rank {r} " + (f"made {last['call']} call(s), the last at step {last['step']}" if last
                                     else "made no call yet"))
    raise InspectorError(
        f"check_step call {call} (step {fingerprint['step']}) on rank {rank}: "
        f"{', '.join(f'rank {r}' for r in missing)} did not reach it within {timeout:g} s "
        f"({'; '.join(parts)}). "
        "Every rank must call check_step at the same steps; a rank that skipped one or stopped is behind. "
        "No collective was started."
    )
