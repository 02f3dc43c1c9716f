"""Where a run's replay files lie (next to the run file, one per kept error step and rank), listing
and removing them, and writing one whole or not at all."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from ...utils.findings import InspectorError
from .reading import ReplayFile
from .record import FORMAT, SUFFIX, VERSION, ReplayMeta


def replay_path(run_path: str | os.PathLike, step: int, rank: int = 0, world: int = 1) -> Path:
    """Where the replay file of ``step`` of ``run_path`` goes (for ``rank`` of ``world``)."""
    p = Path(run_path)
    return p.with_name(f"{p.name}{f'.rank{rank}' if world > 1 else ''}.step{step}{SUFFIX}")


def kept_steps(run_path: str | os.PathLike, rank: int = 0) -> list[int]:
    """The steps of ``run_path`` (for ``rank``) kept with their weights: the ones :func:`replay` can run.
    A replay file that does not read is left out (replaying names what is wrong with it)."""
    from ...utils.paths import confined

    steps: set[int] = set()
    for f in replay_files(run_path):
        try:
            meta = ReplayFile(confined(f, [Path(run_path).parent], what="replay file")).meta
        except InspectorError:
            continue
        if meta.rank == rank:
            steps |= {s.step for s in meta.steps if s.weights}
    return sorted(steps)


def replay_files(run_path: str | os.PathLike) -> list[Path]:
    """The replay files next to ``run_path``, by rank then step."""
    p = Path(run_path)
    mine = re.compile(re.escape(p.name) + r"(?:\.rank(\d+))?\.step(\d+)" + re.escape(SUFFIX) + "$")
    found = []
    if p.parent.is_dir():
        for f in p.parent.iterdir():
            m = mine.match(f.name)
            if m:
                found.append((int(m.group(1) or 0), int(m.group(2)), f))
    return [f for _, _, f in sorted(found)]


def remove_replay_files(run_path: str | os.PathLike, rank: int, world: int) -> None:
    """Remove this rank's replay files of an earlier run at ``run_path`` (a new run starts clean)."""
    for f in replay_files(run_path):
        if world == 1 and ".rank" not in f.name[len(Path(run_path).name) :] or f".rank{rank}." in f.name:
            f.unlink(missing_ok=True)


def write_replay(path: Path, meta: ReplayMeta, tensors: dict[str, torch.Tensor]) -> Path:
    """Write ``tensors`` (copied to the host) and ``meta`` to ``path``, whole or not at all."""
    from safetensors.torch import save_file

    host = {k: t.detach().to("cpu", copy=True).contiguous() for k, t in tensors.items()}
    tmp = path.with_name(path.name + ".tmp")
    try:
        save_file(
            host, str(tmp), metadata={"format": FORMAT, "version": str(VERSION), "replay": meta.to_json()}
        )
        os.replace(tmp, path)  # a reader never sees half a file
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise InspectorError(f"cannot write the replay file {path} ({exc.strerror or exc})") from None
    return path
