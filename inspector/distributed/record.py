"""The step record ``check_step`` writes: built from the gathered numbers, appended as one JSON line."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import torch

FORMAT = "inspector-distributed"
VERSION = 1
# per tensor: local grad sum of squares, grad NaN, grad Inf, local numel, has grad, replica key,
# value NaN, value Inf
PER_TENSOR = 8
# per rank: param bytes, grad bytes, buffer bytes, device allocated, device peak, rss, peak rss, loss, has loss
PER_RANK = 9


def build_record(static: list[dict[str, Any]], holders: list[float], per_tensor: torch.Tensor,
                 per_rank: torch.Tensor, hashes: torch.Tensor, step: int, world: int, backend: str,
                 note: str) -> dict[str, Any]:
    """The JSON-ready record of one step from every rank's numbers.

    ``static``: per tensor, the fields that do not change between steps; ``holders``: how many
    ranks hold each element of each gradient (NaN: a plain tensor, 0: a ``Partial`` one).
    """
    pt = per_tensor.tolist()    # [rank][tensor][stat]
    hs = hashes.tolist()        # [rank][tensor][2]
    ranks_ = range(world)
    rows = []
    total_sq = 0.0
    global_nonfinite = 0
    for i, fixed in enumerate(static):
        sq = [pt[r][i][0] for r in ranks_]
        nan = [int(pt[r][i][1]) for r in ranks_]
        inf = [int(pt[r][i][2]) for r in ranks_]
        has_grad = any(pt[r][i][4] > 0 for r in ranks_)
        factor = holders[i]
        if not has_grad or factor == 0.0:
            gsq = math.nan
        elif math.isnan(factor):
            gsq = sq[0]
        else:  # each element is held by `factor` ranks: the sum over ranks counts it that often
            gsq = sum(sq) / factor
        if has_grad:  # a NaN gradient makes the total NaN, as in clip_grad_norm_; so does a Partial one
            total_sq += gsq
        global_nonfinite += sum(nan) + sum(inf)
        rows.append({
            **fixed, "has_grad": has_grad,
            "local_numel": [int(pt[r][i][3]) for r in ranks_],
            "grad_norm": math.sqrt(gsq) if has_grad and gsq >= 0 else None,
            "local_grad_norm": [math.sqrt(v) if has_grad and v >= 0 else None for v in sq],
            "nan": nan, "inf": inf,
            "value_nan": [int(pt[r][i][6]) for r in ranks_], "value_inf": [int(pt[r][i][7]) for r in ranks_],
            "replica_key": [int(pt[r][i][5]) for r in ranks_],
            "hash": [hs[r][i] for r in ranks_],
        })
    return {
        "format": FORMAT, "version": VERSION, "step": int(step), "time": time.time(),
        "world_size": world, "backend": backend, "note": note,
        "global": {"grad_norm": math.sqrt(total_sq), "nonfinite": global_nonfinite,
                   "param_numel": sum(r["numel"] for r in rows if r["kind"] == "parameter")},
        "ranks": [_rank(r, pt[r], per_rank[r].tolist(), static) for r in ranks_], "tensors": rows,
    }


def _rank(r: int, stats: list[list[float]], own: list[float], static: list[dict[str, Any]]) -> dict[str, Any]:
    is_param = [s["kind"] == "parameter" for s in static]
    sq = sum(row[0] for row, p in zip(stats, is_param, strict=True) if p)
    pb, gb, bb, alloc, peak, rss, peak_rss, loss, has_loss = own
    return {
        "rank": r,
        "grad_norm": math.sqrt(sq) if any(is_param) and sq >= 0 else None,
        "nonfinite": int(sum(row[1] + row[2] for row in stats)),
        "value_nonfinite": int(sum(row[6] + row[7] for row in stats)),
        "param_numel": int(sum(row[3] for row, p in zip(stats, is_param, strict=True) if p)),
        "param_bytes": int(pb), "grad_bytes": int(gb), "buffer_bytes": int(bb),
        "device_allocated": None if math.isnan(alloc) else int(alloc),
        "device_peak": None if math.isnan(peak) else int(peak),
        "rss": None if math.isnan(rss) else int(rss), "peak_rss": int(peak_rss),
        "loss": loss if has_loss else None, "loss_finite": bool(math.isfinite(loss)) if has_loss else None,
    }


def append_record(path: str | os.PathLike, record: dict[str, Any]) -> None:
    """Append ``record`` as one JSON line to ``path`` (its folder is made if missing)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(finite(record), allow_nan=False, default=str, separators=(",", ":"))
    with open(p, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


def finite(value: Any) -> Any:
    """NaN and Inf become null: JSON has no spelling for them."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value
