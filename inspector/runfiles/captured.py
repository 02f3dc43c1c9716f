"""The inputs and outputs of the module that first produced a NaN/Inf, as detached copies.

They are kept in memory (``w.result.captures``) and stored next to the run file, in a
safetensors file named by :func:`captures_path` (``run.inspect.captures.safetensors``; under
several ranks each rank that captured writes ``run.inspect.rank1.captures.safetensors``).
Its tensors are ``input/0, input/1, ..., output/0, ...``; its metadata names the module, the
step, the rank and what the byte budget left out. :func:`read_captures` (and ``Run.captures``)
reads it back as a :class:`~inspector.capture.Captures`.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ..capture import Captures, Skipped
from ..utils.findings import Finding, InspectorError
from ..utils.paths import confined, regular_file

SUFFIX = ".captures.safetensors"
FORMAT = "inspector-watch-captures"


def producer_note(name: str, step: int, rank: int | None) -> Finding:
    on = f" on rank {rank}" if rank else ""
    return Finding("nonfinite-forward", "error", name,
                   f"inputs and outputs of {name}{on} at step {step}, when it first produced NaN/Inf")


def producer_of(caps: Captures) -> tuple[str, int, int]:
    """``(module, step, rank)`` of a producer's captures (taken by the watch, or read from a file)."""
    return caps.order[0], int(caps._state.get("step", 0)), int(caps._state.get("rank", 0))


def captures_path(run_path: str | os.PathLike, rank: int = 0, world: int = 1) -> Path:
    """Where the captures of ``run_path``'s producer are stored (for ``rank`` of ``world``)."""
    p = Path(run_path)
    return p.with_name(p.name + (f".rank{rank}" if world > 1 else "") + SUFFIX)


def _leaves(value: Any) -> list[Any]:
    return list(value) if isinstance(value, tuple) else [] if value is None else [value]


def save_captures(caps: Captures, path: str | os.PathLike) -> Path:
    """Write ``caps`` (one producer's copies, as the watch makes them) to ``path``."""
    from safetensors.torch import save_file

    name = caps.order[0]
    tensors = {
        f"{kind}/{i}": t.contiguous()
        for kind, store in (("input", caps.inputs), ("output", caps.outputs))
        for i, t in enumerate(_leaves(store.get(name)))
    }
    meta = {"format": FORMAT, "module": name, "step": str(caps._state.get("step", 0)),
            "rank": str(caps._state.get("rank", 0)),
            "skipped": json.dumps([s.__dict__ for s in caps.skipped])}
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, out)  # a reader never sees half a file
    except OSError as exc:
        raise InspectorError(f"cannot write the captures file {out} ({exc.strerror or exc})") from None
    return out


_KEY = re.compile(r"(input|output)/(0|[1-9]\d{0,5})")
_INT = re.compile(r"-?\d{1,19}")
MAX_RANK = 1 << 20
MAX_SKIPPED_BYTES = 1 << 20  # the JSON list of what the byte budget left out (a few hundred bytes a leaf)
_SKIPPED_TYPES = {"module": str, "kind": str, "path": str, "bytes": int, "reason": str}


def _number(meta: dict[str, str], key: str, low: int, high: int, name: str) -> int:
    text = meta.get(key, "0")
    if not _INT.fullmatch(text) or not low <= int(text) <= high:
        raise InspectorError(f"{name}: its metadata's {key} is {text[:40]!r}, not a whole number from "
                             f"{low:,} to {high:,}; the captures file is damaged or was not written by the "
                             "watch")
    return int(text)


def _skipped(meta: dict[str, str], name: str) -> list[Skipped]:
    """What the byte budget left out, each entry checked field by field (the file is untrusted)."""
    text = meta.get("skipped", "[]")
    bad = f"{name}: its metadata's skipped is not a list of what the byte budget left out"
    if len(text) > MAX_SKIPPED_BYTES:
        raise InspectorError(f"{bad} ({len(text):,} characters; at most {MAX_SKIPPED_BYTES:,})")
    try:
        items = json.loads(text)
    except (ValueError, RecursionError):
        raise InspectorError(f"{bad} (not JSON)") from None
    if not isinstance(items, list):
        raise InspectorError(f"{bad} (a JSON {type(items).__name__})")
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or set(item) != set(_SKIPPED_TYPES) or any(
                type(item[k]) is not t for k, t in _SKIPPED_TYPES.items()):
            raise InspectorError(f"{bad} (entry {i} is not an object of module, kind, path, reason as "
                                 "text and bytes as a whole number)")
        out.append(Skipped(**item))
    return out


def _tensor_keys(keys: list[str], name: str) -> dict[str, list[str]]:
    """The keys of each kind in order (``input/0, input/1...``); any other key, or a gap, is refused."""
    by_kind: dict[str, list[str]] = {"input": [], "output": []}
    for key in keys:
        match = _KEY.fullmatch(key)
        if match is None:
            raise InspectorError(f"{name}: holds a tensor named {key[:60]!r}; a captures file holds only "
                                 "input/N and output/N")
        by_kind[match.group(1)].append(key)
    for kind, found in by_kind.items():
        found.sort(key=lambda k: int(k.partition("/")[2]))
        if [int(k.partition("/")[2]) for k in found] != list(range(len(found))):
            raise InspectorError(f"{name}: its {kind} tensors are not numbered 0, 1, 2...; the captures "
                                 "file is damaged")
    return by_kind


def load_captures(path: str | os.PathLike) -> Captures:
    """Read a captures file :func:`save_captures` wrote. Like a run file it is untrusted: its metadata
    (module, step, rank, what was left out) and its tensor names are checked before any is used.

    Raises:
        InspectorError: the file is not a watch captures file, or something in it is not what the watch
            writes (the message names the file and what; a FIFO or a device is refused before it is
            opened: ``safe_open`` would block in it holding the GIL).
    """
    from safetensors import safe_open

    regular_file(path, "captures file")
    name = Path(path).name
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            if meta.get("format") != FORMAT:
                raise InspectorError(f"{name} is a safetensors file but not a watch captures file")
            keys = _tensor_keys(list(fh.keys()), name)
            tensors = {k: fh.get_tensor(k) for kind in keys.values() for k in kind}
    except InspectorError:
        raise
    except Exception as exc:  # safetensors raises its own error types
        raise InspectorError(f"{name} is not a readable captures file ({exc})") from None
    module = meta.get("module")
    if not isinstance(module, str) or not module or len(module) > 4096:
        raise InspectorError(f"{name}: its metadata names no module (or a name over 4,096 characters); "
                             "the captures file is damaged or was not written by the watch")
    step = _number(meta, "step", -(1 << 63), (1 << 63) - 1, name)
    rank = _number(meta, "rank", 0, MAX_RANK, name)
    skipped = _skipped(meta, name)

    def pick(kind: str) -> Any:
        leaves = [tensors[k] for k in keys[kind]]
        return leaves[0] if len(leaves) == 1 else tuple(leaves)

    return Captures(
        outputs={module: pick("output")},
        inputs={module: pick("input")},
        order=[module],
        skipped=skipped,
        findings=[producer_note(module, step, rank)],
        store_on="cpu",
        _state={"step": step, "rank": rank},
        mutations_watched=False,
    )


def read_captures(run_path: str | os.PathLike) -> Captures | None:
    """The stored producer captures of the run file ``run_path`` (the earliest step's, lowest
    rank first under several ranks), or None when the run captured nothing. A captures file's
    own path is read as it is.

    Raises:
        InspectorError: ``run_path`` does not exist, or a captures file next to it is damaged.
    """
    p = Path(run_path)
    if p.name.endswith(SUFFIX) and os.path.lexists(p):
        return load_captures(p)
    if not os.path.lexists(p):
        raise InspectorError(f"run file {p} does not exist; give the path of a file that watch(...) or "
                             "`python -m inspector watch` wrote")
    regular_file(p, "run file")
    mine = re.compile(re.escape(p.name) + r"(\.rank\d+)?" + re.escape(SUFFIX) + "$")
    found = sorted(f for f in p.parent.iterdir() if mine.match(f.name)) if p.parent.is_dir() else []
    caps = [load_captures(confined(f, [p.parent], what="captures file", refusal=lambda t: (
        f"captures file {t} is a link that leads outside {p.parent}; a run's captures lie next to it")))
        for f in found]
    if not caps:
        return None
    return min(caps, key=lambda c: (c._state["step"], c._state["rank"]))


def remove_captures(run_path: str | os.PathLike, rank: int, world: int) -> None:
    """Remove this rank's captures file of an earlier run at ``run_path`` (a new run starts clean)."""
    captures_path(run_path, rank, world).unlink(missing_ok=True)
