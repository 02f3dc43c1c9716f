"""Reading a replay file back as untrusted input: the header's length checked before safetensors
parses it, every field of its record checked (:func:`parse_meta`), every tensor the record names
(:func:`expected_keys`) present with the dtype it must have and nothing else (:class:`ReplayFile`)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import torch

from ...runfiles.guard import MAX_META_BYTES, regular_fd
from ...utils.findings import InspectorError
from .record import _NAME, FORMAT, MAX_CALLS, MAX_NAMES, MAX_STEPS, VERSION, KeptCall, KeptStep, ReplayMeta


def _bad(path: Path, why: str) -> InspectorError:
    return InspectorError(
        f"replay file {path.name} was refused: {why}; a replay file is written by "
        "inspector.watch(..., keep=True) next to its run file"
    )


def _header(path: Path) -> None:
    """The safetensors header's length, checked against the file before safetensors reads it."""
    fd = regular_fd(path)
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
    finally:
        os.close(fd)
    if len(head) < 8:
        raise _bad(path, f"it holds {size} bytes, less than a safetensors header")
    (length,) = struct.unpack("<Q", head)
    if length > MAX_META_BYTES or 8 + length > size:
        raise _bad(path, f"its header claims {length:,} bytes in a file of {size:,} (truncated or forged)")


def _strings(value: Any, path: Path, what: str, most: int = MAX_NAMES) -> tuple[str, ...]:
    if (
        not isinstance(value, list)
        or len(value) > most
        or not all(isinstance(v, str) and 0 < len(v) <= _NAME for v in value)
    ):
        raise _bad(path, f"its {what} is not a list of names")
    return tuple(value)


def _int(value: Any, path: Path, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 62:
        raise _bad(path, f"its {what} is not a whole number")
    return value


def _text_map(value: Any, path: Path, what: str) -> dict[str, str]:
    if (
        not isinstance(value, dict)
        or len(value) > 64
        or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= _NAME
            for k, v in value.items()
        )
    ):
        raise _bad(path, f"its {what} is not a small map of names")
    return dict(value)


def _call(value: Any, path: Path) -> KeptCall:
    fields = {"args", "kwargs", "rng", "autocast", "eval", "written"}
    if not isinstance(value, dict) or set(value) - {"loss"} != fields:  # loss: absent in older files
        raise _bad(path, "a kept call does not have the fields args, kwargs, rng, autocast, eval, written")
    return KeptCall(
        value["args"],
        value["kwargs"],
        _text_map(value["rng"], path, "generator states"),
        _text_map(value["autocast"], path, "autocast state"),
        _strings(value["eval"], path, "modules in eval mode"),
        _strings(value["written"], path, "batch tensors written in place"),
        _loss(value.get("loss"), path, "a kept call's loss"),
    )


def _loss(value: Any, path: Path, what: str) -> float | None:
    if value is None:
        return None
    try:
        return float.fromhex(value)
    except (TypeError, ValueError):
        raise _bad(path, f"{what} is not a float written as hex") from None


def _step(value: Any, path: Path) -> KeptStep:
    if not isinstance(value, dict) or set(value) != {"step", "calls", "weights", "loss"}:
        raise _bad(path, "a kept step does not have the fields step, calls, weights, loss")
    calls = value["calls"]
    if not isinstance(calls, list) or len(calls) > MAX_CALLS or not isinstance(value["weights"], bool):
        raise _bad(path, "a kept step's calls or weights flag is malformed")
    loss = _loss(value["loss"], path, "a kept step's loss")
    return KeptStep(
        _int(value["step"], path, "step"), tuple(_call(c, path) for c in calls), value["weights"], loss
    )


def parse_meta(text: str, path: Path) -> ReplayMeta:
    """The :class:`ReplayMeta` of ``text``, every field's type checked.

    Raises:
        InspectorError: naming ``path`` and the first field that is not what the watch writes.
    """
    if len(text) > MAX_META_BYTES:
        raise _bad(path, f"its metadata is over {MAX_META_BYTES:,} bytes")
    try:
        raw = json.loads(text, parse_constant=lambda c: None)
    except ValueError:
        raise _bad(path, "its metadata is not JSON") from None
    fields = {"run", "model", "rank", "world", "parameters", "buffers", "step", "findings", "steps"}
    if not isinstance(raw, dict) or set(raw) != fields:
        raise _bad(path, f"its metadata does not have exactly the fields {', '.join(sorted(fields))}")
    if not (isinstance(raw["run"], str) and isinstance(raw["model"], str) and len(raw["model"]) <= _NAME):
        raise _bad(path, "its run or model name is not text")
    findings = raw["findings"]
    if (
        not isinstance(findings, list)
        or len(findings) > 10_000
        or not all(
            isinstance(f, list) and len(f) == 4 and all(isinstance(x, str) for x in f) for f in findings
        )
    ):
        raise _bad(path, "its findings are not [code, severity, where, message] lists")
    steps = raw["steps"]
    if not isinstance(steps, list) or not 0 < len(steps) <= MAX_STEPS:
        raise _bad(
            path,
            f"it keeps {len(steps) if isinstance(steps, list) else 'no list of'} steps "
            f"(1 to {MAX_STEPS} expected)",
        )
    world = _int(raw["world"], path, "world size")
    rank = _int(raw["rank"], path, "rank")
    if not 0 <= rank < max(world, 1):
        raise _bad(path, f"its rank {rank} is outside its world of {world}")
    return ReplayMeta(
        raw["run"],
        raw["model"],
        rank,
        world,
        _strings(raw["parameters"], path, "parameters"),
        _strings(raw["buffers"], path, "buffers"),
        _int(raw["step"], path, "step"),
        tuple((f[0], f[1], f[2], f[3]) for f in findings),
        tuple(_step(s, path) for s in steps),
    )


def expected_keys(meta: ReplayMeta) -> dict[str, str]:
    """Every tensor key the record names, with what it is (``weight``, ``buffer``, ``rng``, ``batch``)."""
    keys: dict[str, str] = {}
    for s in meta.steps:
        if s.weights:
            keys.update({f"s{s.step}/w/{n}": "weight" for n in meta.parameters})
            keys.update({f"s{s.step}/b/{n}": "buffer" for n in meta.buffers})
        for i, c in enumerate(s.calls):
            keys.update({k: "rng" for k in c.rng.values()})
            keys.update(
                {
                    k: "batch"
                    for k in _tensor_keys(c.args) + _tensor_keys(c.kwargs)
                    if k.startswith(f"s{s.step}/c{i}/")
                }
            )
    return keys


def _tensor_keys(node: Any, depth: int = 0) -> list[str]:
    if depth > 40:
        return []
    if isinstance(node, dict):
        if "t" in node and isinstance(node["t"], str):
            return [node["t"]]
        return [k for v in node.values() for k in _tensor_keys(v, depth + 1)]
    if isinstance(node, list):
        return [k for v in node for k in _tensor_keys(v, depth + 1)]
    return []


class ReplayFile:
    """An open, checked replay file: :attr:`meta`, and :meth:`tensor` reads one tensor by key."""

    def __init__(self, path: str | os.PathLike) -> None:
        from safetensors import safe_open

        self.path = Path(path)
        _header(self.path)
        try:
            with safe_open(str(self.path), framework="pt") as fh:
                raw = fh.metadata() or {}
                keys = set(fh.keys())
                slices = {k: fh.get_slice(k) for k in keys}
                self.shapes = {k: tuple(s.get_shape()) for k, s in slices.items()}
                self._dtypes = {k: (s.get_dtype(), len(self.shapes[k])) for k, s in slices.items()}
        except InspectorError:
            raise
        except Exception as exc:  # safetensors raises its own error types
            raise _bad(self.path, f"it is not a readable safetensors file ({str(exc)[:200]})") from None
        if raw.get("format") != FORMAT:
            raise _bad(self.path, "it is a safetensors file without the replay format mark")
        if raw.get("version") != str(VERSION):
            raise _bad(
                self.path,
                f"its version {str(raw.get('version'))[:20]!r} is not {VERSION}, the one this "
                "version of the inspector reads",
            )
        self.meta = parse_meta(raw.get("replay", ""), self.path)
        wanted = expected_keys(self.meta)
        missing, extra = sorted(set(wanted) - keys), sorted(keys - set(wanted))
        if missing or extra:
            what = (
                f"the tensor {missing[0]!r} it names is missing"
                if missing
                else f"it holds the tensor {extra[0]!r} that its record does not name"
            )
            raise _bad(self.path, what)
        for k, kind in wanted.items():
            if kind == "rng" and self._dtypes[k] != ("U8", 1):
                raise _bad(self.path, f"the generator state {k!r} is not a flat uint8 tensor")

    def tensor(self, key: str) -> torch.Tensor:
        from safetensors import safe_open

        try:
            with safe_open(str(self.path), framework="pt") as fh:
                return fh.get_tensor(key).clone()  # fresh, aligned memory (see tensors)
        except Exception as exc:  # noqa: BLE001 - the file changed since it was checked
            raise _bad(self.path, f"the tensor {key!r} cannot be read ({str(exc)[:200]})") from None

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """Every tensor whose key starts with ``prefix``, keyed by the rest of the key."""
        from safetensors import safe_open

        try:
            with safe_open(str(self.path), framework="pt") as fh:
                # copies in fresh memory: a tensor read at an odd offset of the file sums in another order
                # on the CPU (vectorised loops start at an aligned address), so its last bits would differ
                keys = [k for k in self._dtypes if k.startswith(prefix)]
                return {k[len(prefix) :]: fh.get_tensor(k).clone() for k in keys}
        except Exception as exc:  # noqa: BLE001 - the file changed since it was checked
            raise _bad(self.path, f"its tensors cannot be read ({str(exc)[:200]})") from None
