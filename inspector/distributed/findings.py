"""Findings of one distributed step, from the gathered record alone (the same on every rank)."""

from __future__ import annotations

import math
from collections import Counter
from statistics import median
from typing import Any

from ..runfiles import unsynchronised
from ..sharding.findings import about, nonfinite_by_rank
from ..sharding.findings import ranks_text as _ranks
from ..utils.findings import Finding

IMBALANCE = 0.05  # a rank holding this fraction more sharded elements than the mean is reported


def step_findings(record: dict[str, Any], far_factor: float = 10.0) -> list[Finding]:
    """Every finding of one step record (see :func:`inspector.distributed.check_step`)."""
    findings: list[Finding] = []
    gradients: list[Finding] = []
    several = record["world_size"] > 1
    for row in record["tensors"]:  # cheap tests first: most rows of a healthy step have nothing to say
        row_findings(row, record["step"], several, findings, gradients)
    findings += gradients if len(gradients) < 2 else [spread(record, gradients)]
    findings += _far_off(record, far_factor)
    findings += imbalance(record)
    return findings


def row_findings(row: dict[str, Any], step: int, several: bool, findings: list[Finding],
                 gradients: list[Finding]) -> None:
    """The findings of one tensor's row: into ``findings``, its non-finite gradient into ``gradients``."""
    hashes = row["hash"]
    if several and hashes and hashes.count(hashes[0]) != len(hashes):
        findings += _drift(row, step)
    if any(row.get("value_nan") or ()) or any(row.get("value_inf") or ()):
        findings += nonfinite_values(row)
    if any(row["nan"]) or any(row["inf"]):
        gradients += nonfinite_by_rank(row)
    norms = row["local_grad_norm"]
    if several and not row["placements"] and row["kind"] == "parameter" and norms \
            and norms.count(norms[0]) != len(norms):
        findings += _unsynchronised(row)


def _drift(row: dict[str, Any], step: int) -> list[Finding]:
    """Ranks that must hold the same values of a tensor but hold different bits."""
    out = []
    keys = row["replica_key"]
    by_key: dict[int, list[int]] = {}
    for r, k in enumerate(keys):
        if k >= 0:
            by_key.setdefault(k, []).append(r)
    for ranks in by_key.values():
        if len(ranks) < 2:
            continue
        hashes = {r: tuple(row["hash"][r]) for r in ranks}
        counts = Counter(hashes.values())
        if len(counts) == 1:
            continue
        majority, _ = counts.most_common(1)[0]
        agree = [r for r in ranks if hashes[r] == majority]
        differ = [r for r in ranks if hashes[r] != majority]
        if row.get("resync") == "buffers" and 0 in ranks:
            out.append(
                Finding(
                    "replica-resynchronised",
                    "info",
                    row["name"],
                    f"buffer {row['name']} differs between {_ranks(ranks)} at step {step} (each rank updated "
                    "it in its own forward pass, as BatchNorm does with its running statistics). "
                    "DistributedDataParallel(broadcast_buffers=True) copies rank 0's buffers to every rank "
                    "at the start of the next forward pass, so the copies are re-synchronised: not a drift.",
                )
            )
            continue
        out.append(_drift_finding(row, step, ranks, agree, differ, counts))
    return out


_DRIFT_CAUSES = ("Something updated it on one rank only (an unsynchronised buffer such as BatchNorm running "
                 "statistics, a parameter outside FSDP/DDP, a rank-dependent seed or in-place edit)")


def _drift_finding(row: dict[str, Any], step: int, ranks: list[int], agree: list[int], differ: list[int],
                   counts: Counter) -> Finding:
    """``replica-drift`` for one replica group. With a strict majority the other ranks are the odd ones
    and the fix copies from a rank of the majority. Without one (2 copies, or a tie) a copy holding
    NaN/Inf where the others are finite is the wrong one; else every copy is named and none is taken as
    the right one."""
    held = f"{row['kind']} {row['name']} should be identical on {_ranks(ranks)} but at step {step}"
    top = counts.most_common(2)
    tie = len(top) > 1 and top[0][1] == top[1][1]
    nan, inf = row.get("value_nan") or [0] * len(row["hash"]), row.get("value_inf") or [0] * len(row["hash"])
    bad = [r for r in ranks if nan[r] or inf[r]]
    finite = ""
    if tie and 0 < len(bad) < len(ranks):  # the values tell the copies apart
        agree, differ = [r for r in ranks if r not in bad], bad
        finite = (f", and NaN/Inf where {_ranks(agree)} {'is' if len(agree) == 1 else 'are'} finite: the "
                  "non-finite copy is the wrong one")
    elif tie:  # nothing here tells which copy is wrong
        return about(Finding(
            "replica-drift", "error", row["name"],
            f"{held} {_ranks(ranks)} hold different values, {len(counts)} versions with no majority: nothing "
            f"here tells which copy is wrong, so copying one onto the others may spread the bad one. Tell "
            f"them apart first: compare each rank's copy with the last checkpoint, look at each rank's "
            f"optimizer state for it (a step the others did not take moves its exp_avg / momentum), or "
            f"run a third replica and keep the copy two agree on; then broadcast the right one from its "
            f"rank, or shard/wrap it. {_DRIFT_CAUSES}."), ranks)
    return about(Finding(
        "replica-drift", "error", row["name"],
        f"{held} {_ranks(differ)} {'holds' if len(differ) == 1 else 'hold'} different values from "
        f"{_ranks(agree)}{finite}. {_DRIFT_CAUSES}; broadcast it from rank {agree[0]}"
        f"{'' if finite else ' (of the majority)'} or shard/wrap it."), differ)


def nonfinite_values(row: dict[str, Any]) -> list[Finding]:
    """``nonfinite-parameter``: the ranks whose local piece of a parameter's or buffer's values
    (not its gradient) holds NaN/Inf."""
    nan, inf = row.get("value_nan") or [], row.get("value_inf") or []
    bad = [r for r, (n, i) in enumerate(zip(nan, inf, strict=True)) if n or i]
    if not bad:
        return []
    counts = "; ".join(f"rank {r}: {nan[r]} NaN, {inf[r]} Inf" for r in bad)
    fine = [r for r in range(len(nan)) if r not in bad]
    tail = f"; {_ranks(fine)} {'is' if len(fine) == 1 else 'are'} finite" if fine else ""
    return [about(Finding(
        "nonfinite-parameter", "error", row["name"],
        f"the values of {row['kind']} {row['name']} (not its gradient) are not finite on {_ranks(bad)} "
        f"({counts} in the local piece){tail}. Every forward pass now spreads it to the outputs and "
        "gradients of every rank: look for what wrote it (an optimizer step on a non-finite gradient, "
        "an in-place edit, a checkpoint load)."), bad)]


def _origin_ranks(record: dict[str, Any]) -> list[int]:
    """The ranks :func:`_origin` names as where non-finite values started (empty: it names none)."""
    for row in record["tensors"]:
        bad = [r for r, (n, i) in enumerate(zip(row.get("value_nan") or [], row.get("value_inf") or [],
                                                 strict=True)) if n or i]
        if bad:
            return bad
    ranks = record.get("ranks", [])
    bad = [r["rank"] for r in ranks if r.get("loss_finite") is False]
    return bad if len(bad) < len(ranks) else []


def _origin(record: dict[str, Any]) -> str:
    """Where non-finite values started, as far as one step's numbers tell."""
    for row in record["tensors"]:
        bad = [r for r, (n, i) in enumerate(zip(row.get("value_nan") or [], row.get("value_inf") or [],
                                                 strict=True)) if n or i]
        if bad:
            return (f"They start at {_ranks(bad)}'s piece of {row['kind']} {row['name']}, whose values are "
                    "not finite (the first such tensor in registration order)")
    ranks = record.get("ranks", [])
    losses = [r.get("loss_finite") for r in ranks]
    bad = [r["rank"] for r in ranks if r.get("loss_finite") is False]
    if bad and len(bad) < len(ranks):
        return f"They start at the loss of {_ranks(bad)}, which is not finite while the other ranks' is"
    if bad:
        return "The loss is not finite on every rank: look at the model's forward pass and the batches"
    if all(v is None for v in losses):
        return ("Every rank's values are finite: pass loss= to check_step to name the rank whose loss "
                "went non-finite first")
    return "Every rank's values and loss are finite: the backward pass made them (an overflow in a layer)"


def spread(record: dict[str, Any], found: list[Finding]) -> Finding:
    """One ``nonfinite-gradient`` for many tensors: NaN reached them through the gradient reduction."""
    ranks = sorted({r for row in record["tensors"] for r, (n, i) in enumerate(zip(row["nan"], row["inf"],
                                                                                 strict=True)) if n or i})
    names = [f.where for f in found]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    return about(Finding(
        "nonfinite-gradient", "error", names[0],
        f"the gradients of {len(names)} tensors are not finite on {_ranks(ranks)} ({shown}): non-finite "
        f"values spread through the forward pass and the gradient reduction. {_origin(record)}."),
        _origin_ranks(record) or ranks)


def _unsynchronised(row: dict[str, Any]) -> list[Finding]:
    """A plain (not sharded, not DTensor) parameter whose gradient differs between ranks."""
    if not unsynchronised(row):
        return []
    norms = row["local_grad_norm"]
    lo, hi = min(norms), max(norms)
    return [Finding(
        "gradient-not-synchronized", "warning", row["name"],
        f"{row['name']} is a plain parameter on every rank, but its gradient norm ranges from "
        f"{lo:.4g} to {hi:.4g} across ranks: its gradients are not averaged, so the replicas will "
        "drift apart. Shard it with fully_shard, wrap the model in DDP, or all-reduce its gradient.")]


def _rms(record: dict[str, Any]) -> dict[int, float]:
    """Each rank's gradient RMS per element over its local pieces (finite ones only)."""
    rms: dict[int, float] = {}
    for rank in range(record["world_size"]):
        sq = numel = 0.0
        for row in record["tensors"]:
            v = row["local_grad_norm"][rank] if row["local_grad_norm"] else None
            if v is None or not math.isfinite(v):
                continue
            sq += v * v
            numel += row["local_numel"][rank]
        if numel:
            rms[rank] = math.sqrt(sq / numel)
    return rms


def _far_off(record: dict[str, Any], far_factor: float) -> list[Finding]:
    """A rank whose gradient RMS per element is far above or below the other ranks' median."""
    return far_off(_rms(record), far_factor)


def far_off(rms: dict[int, float], far_factor: float) -> list[Finding]:
    """``gradient-far-off`` from each rank's gradient RMS per element."""
    if len(rms) < 2 or any(v <= 0 for v in rms.values()):
        return []
    if len(rms) == 2:
        (a, va), (b, vb) = sorted(rms.items(), key=lambda kv: -kv[1])
        if va / vb < far_factor:
            return []
        return [about(Finding(
            "gradient-far-off", "warning", f"ranks {min(a, b)} and {max(a, b)}",
            f"rank {a}'s gradients are {va / vb:.3g}x larger per element than rank {b}'s (RMS {va:.3g} "
            f"against {vb:.3g}). With 2 ranks there is no majority to tell which one is off: compare each "
            "with an earlier step, or run with more ranks. Causes: a bad batch, a different loss scale or a "
            "missed gradient reduction on one rank."), [a, b])]
    out = []
    middle = median(rms.values())  # of every rank: one rank far off cannot move it
    for rank, value in rms.items():
        ratio = value / middle
        if ratio >= far_factor or ratio <= 1 / far_factor:
            how = f"{ratio:.3g}x larger" if ratio > 1 else f"{1 / ratio:.3g}x smaller"
            out.append(about(
                Finding(
                    "gradient-far-off",
                    "warning",
                    f"rank {rank}",
                    f"rank {rank}'s gradients are {how} per element than the median of the {len(rms)} ranks "
                    f"(RMS {value:.3g} against {middle:.3g}): a bad batch, a different loss scale or a "
                    "missed gradient reduction on that rank.",
                ), [rank])
            )
    return out


def imbalance(record: dict[str, Any], threshold: float = IMBALANCE) -> list[Finding]:
    """Ranks holding unequal shares of the sharded parameters."""
    world = record["world_size"]
    sharded = [r for r in record["tensors"] if r["kind"] == "parameter" and "Shard" in r["placements"]]
    if world < 2 or not sharded:
        return []
    totals = [sum(r["local_numel"][k] for r in sharded) for k in range(world)]
    mean = sum(totals) / world
    if mean == 0 or (max(totals) - mean) / mean <= threshold:
        return []
    worst = sorted(sharded, key=lambda r: max(r["local_numel"]) - min(r["local_numel"]), reverse=True)[:3]
    names = ", ".join(f"{r['name']} ({'/'.join(str(n) for n in r['local_numel'])})" for r in worst)
    big = totals.index(max(totals))
    return [about(
        Finding(
            "shard-imbalance",
            "warning",
            f"rank {big}",
            f"rank {big} holds {max(totals)} sharded parameter elements, "
            f"{100 * (max(totals) - mean) / mean:.1f}% "
            f"above the mean of {mean:.0f} (per rank: {', '.join(str(t) for t in totals)}); most uneven: "
            f"{names}. Dimension 0 of those tensors does not divide by the number of shards.",
        ), [big])
    ]
