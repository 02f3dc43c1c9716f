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


def load_captures(path: str | os.PathLike) -> Captures:
    """Read a captures file :func:`save_captures` wrote.

    Raises:
        InspectorError: the file is not a watch captures file (a FIFO or a device is refused
            before it is opened: ``safe_open`` would block in it holding the GIL).
    """
    from safetensors import safe_open

    regular_file(path, "captures file")
    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118 - safe_open has no __iter__
    except Exception as exc:  # safetensors raises its own error types
        raise InspectorError(f"{Path(path).name} is not a readable captures file ({exc})") from None
    if meta.get("format") != FORMAT:
        raise InspectorError(f"{Path(path).name} is a safetensors file but not a watch captures file")
    name, step, rank = meta["module"], int(meta.get("step", 0)), int(meta.get("rank", 0))

    def pick(kind: str) -> Any:
        leaves = [tensors[k] for k in sorted((k for k in tensors if k.startswith(kind + "/")),
                                             key=lambda k: int(k.partition("/")[2]))]
        return leaves[0] if len(leaves) == 1 else tuple(leaves)

    skipped = [Skipped(**s) for s in json.loads(meta.get("skipped", "[]"))]
    return Captures(
        outputs={name: pick("output")},
        inputs={name: pick("input")},
        order=[name],
        skipped=skipped,
        findings=[producer_note(name, step, rank)],
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
