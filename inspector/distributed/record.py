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
    n = len(static)
    cols = per_tensor.permute(2, 1, 0).contiguous()         # [stat][tensor][rank]
    sq = cols[0]
    has = (cols[4] > 0).any(dim=1).tolist()
    factor = torch.tensor(holders, dtype=torch.float64)
    # each element is held by `factor` ranks: the sum over ranks counts it that often; a plain
    # tensor (NaN factor): rank 0's copy; a Partial one (0): unknown
    gsq = torch.where(factor.isnan(), sq[:, 0] if world else torch.zeros(n, dtype=torch.float64),
                      sq.sum(dim=1) / factor.where(factor > 0, torch.ones_like(factor)))
    gsq = gsq.where(factor != 0, torch.full_like(gsq, math.nan))
    has_t = torch.tensor(has, dtype=torch.bool)
    total_sq = float(gsq[has_t].sum()) if n else 0.0  # a NaN gradient makes the total NaN, as in clip_grad_norm_
    grad_norm = [math.sqrt(v) if h and v >= 0 else None for v, h in zip(gsq.tolist(), has, strict=True)]
    local = [[math.sqrt(v) if h and v >= 0 else None for v in row] for row, h in zip(_per_tensor(sq), has, strict=True)]
    nan, inf, numel, keys, vnan, vinf = (_per_tensor(cols[k].long()) for k in (1, 2, 3, 5, 6, 7))
    hs = [list(map(list, zip(*pair, strict=True))) for pair in zip(*(_per_tensor(hashes[:, :, j].T) for j in range(2)),
                                                                   strict=True)]  # [tensor][rank][2]
    rows = [{**fixed, "has_grad": has[i], "local_numel": numel[i], "grad_norm": grad_norm[i],
             "local_grad_norm": local[i], "nan": nan[i], "inf": inf[i], "value_nan": vnan[i],
             "value_inf": vinf[i], "replica_key": keys[i], "hash": hs[i]}
            for i, fixed in enumerate(static)]
    global_nonfinite = int(cols[1].sum() + cols[2].sum()) if n else 0
    is_param = torch.tensor([s["kind"] == "parameter" for s in static], dtype=torch.bool)
    sums = torch.stack([sq[is_param].sum(dim=0), (cols[1] + cols[2]).sum(dim=0), (cols[6] + cols[7]).sum(dim=0),
                        cols[3][is_param].sum(dim=0)]).T.tolist() if n else [[0.0] * 4] * world
    return {
        "format": FORMAT, "version": VERSION, "step": int(step), "time": time.time(),
        "world_size": world, "backend": backend, "note": note,
        "global": {"grad_norm": math.sqrt(total_sq), "nonfinite": global_nonfinite,
                   "param_numel": sum(r["numel"] for r in rows if r["kind"] == "parameter")},
        "ranks": [_rank(r, sums[r], per_rank[r].tolist(), bool(is_param.any())) for r in range(world)],
        "tensors": rows,
    }


def _per_tensor(columns: torch.Tensor) -> list[list[Any]]:
    """An (n tensors, world) tensor as n lists of one number per rank (built from rows: fast)."""
    return list(map(list, zip(*columns.T.contiguous().tolist(), strict=True))) if columns.numel() else \
        [[] for _ in range(columns.shape[0])]


def _rank(r: int, sums: list[float], own: list[float], has_params: bool) -> dict[str, Any]:
    sq, nonfinite, value_nonfinite, numel = sums
    pb, gb, bb, alloc, peak, rss, peak_rss, loss, has_loss = own
    return {
        "rank": r,
        "grad_norm": math.sqrt(sq) if has_params and sq >= 0 else None,
        "nonfinite": int(nonfinite), "value_nonfinite": int(value_nonfinite), "param_numel": int(numel),
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
