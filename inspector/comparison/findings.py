"""The findings of a weight comparison, read off the tensor table and the two sides' ties."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
import torch

from ..utils.findings import Finding, sort_findings
from .kernels import pair_stats
from .sources import TensorSource
from .summary import cap_findings, from_zero_findings, low_rank_findings, unchanged_findings

_MAX_NAMED = 10


def weight_findings(sa: TensorSource, sb: TensorSource, tensors: pd.DataFrame,
                    rules: Sequence[tuple[str, str, int]], by_value: Sequence[tuple[str, str]],
                    expect_unchanged: Sequence[str] = (), saved_twice: Sequence[tuple[str, str, str]] = ()
                    ) -> tuple[list[Finding], set[str]]:
    """Every finding of one comparison, most severe first, at most ``MAX_PER_CODE`` per code; and the
    names a file stores once through a tie (absent from it, yet not missing)."""
    paired = tensors[(tensors["name"] != "") & (tensors["name_b"] != "")]
    amap = dict(zip(paired["name"], paired["name_b"], strict=True))
    ties, stored_once = tie_findings(sa, sb, amap)
    for side, kept, lone in saved_twice:
        stored_once.add(lone)
        holder, other = (sa, sb) if side == "A" else (sb, sa)
        ties.append(Finding("tie-stored-once", "info", kept,
                            f"{holder.label} holds {kept} and {lone} with the same bits (a tie saved under "
                            f"both names) where {other.label} stores it once, as {kept}; not counted as "
                            f"{'missing' if side == 'A' else 'extra'}"))
    out = ties + rename_findings(sa, sb, rules, by_value, tensors)
    out += lone_findings(sa, sb, tensors, stored_once)
    out += [
        Finding(
            "shape-changed",
            "error",
            r.name,
            f"{r.name} has shape {tuple(r.shape_a)} in {sa.label} but "
            f"{tuple(r.shape_b)} in {sb.label} ({r.name_b}); its values were not compared",
        )
        for r in tensors[tensors["status"] == "shape-changed"].itertuples(index=False)
    ]
    out += dtype_findings(sa, sb, tensors)
    for side, label, column in (("A", sa.label, "nonfinite_a"), ("B", sb.label, "nonfinite_b")):
        for r in tensors[tensors[column] > 0].itertuples(index=False):
            out.append(
                Finding(
                    "nonfinite",
                    "error",
                    r.name,
                    f"{label} ({side}) holds {getattr(r, column)} NaN/Inf "
                    f"values in {r.name if side == 'A' else r.name_b} (of {r.numel})",
                )
            )
    out += unchanged_findings(sb.label, tensors, expect_unchanged)
    out += from_zero_findings(tensors) + low_rank_findings(tensors)
    out += device_findings(sa, sb, tensors)
    out += [f for side in (sa, sb) if not side.is_model for f in side.findings]
    return cap_findings(sort_findings(out)), stored_once


def _values_equal(side: TensorSource, names: Sequence[str]) -> bool:
    first = side.read(names[0]).clone()
    for n in names[1:]:
        other = side.read(n)
        if (
            other.shape != first.shape
            or other.dtype != first.dtype
            or not pair_stats(first, other).bitwise_equal
        ):
            return False
    return True


def _tied(side: TensorSource, names: Sequence[str]) -> bool:
    return any(set(names) <= set(g) for g in side.ties)


def tie_findings(sa: TensorSource, sb: TensorSource, amap: dict[str, str]) -> tuple[list[Finding], set[str]]:
    """``tie-broken`` / ``tie-added`` / ``tie-stored-once``, and the names a file stores once (not missing).

    A tie is one tensor under several names: the same object or storage, or (in a file, which
    cannot hold one object twice) equal values where the other side declares the tie.
    """
    out: list[Finding] = []
    stored_once: set[str] = set()
    bmap = {v: k for k, v in amap.items()}
    for g in sa.ties:
        present = [amap[n] for n in g if n in amap]
        if len(present) == 1 and not sb.is_model:
            absent = [n for n in g if n not in amap]
            stored_once.update(absent)
            out.append(
                Finding(
                    "tie-stored-once",
                    "info",
                    g[0],
                    f"{sb.label} stores the tie {', '.join(g)} once, "
                    f"as {present[0]}; loading it into the model fills {', '.join(absent)} through the tie",
                )
            )
            continue
        if len(present) < 2 or _tied(sb, present) or (not sb.is_model and _values_equal(sb, present)):
            continue
        how = "separate objects" if sb.is_model else "separate tensors"
        values = "equal values" if _values_equal(sb, present) else "different values"
        out.append(
            Finding(
                "tie-broken",
                "error",
                g[0],
                f"{', '.join(g)} are one tensor in {sa.label} but {how} "
                f"with {values} in {sb.label}: training or loading now updates them apart. Re-tie them "
                "(model.tie_weights(), inspector.retie) or load with inspector.move_model",
            )
        )
    for h in sb.ties:
        present = [bmap[n] for n in h if n in bmap]
        if len(present) == 1 and not sa.is_model:
            stored_once.update(n for n in h if n not in bmap)
            continue
        if len(present) < 2 or _tied(sa, present) or (not sa.is_model and _values_equal(sa, present)):
            continue
        out.append(Finding("tie-added", "warning", h[0], f"{', '.join(h)} are one tensor in {sb.label} but "
                           f"{' and '.join(present)} are separate in {sa.label}: B ties what A kept apart"))
    return out, stored_once


def _prefix_text(old: str, new: str) -> str:
    if not old:
        return f"adds the prefix {new!r}"
    if not new:
        return f"drops the prefix {old!r}"
    return f"has the prefix {new!r} where A has {old!r}"


def rename_findings(sa: TensorSource, sb: TensorSource, rules: Sequence[tuple[str, str, int]],
                    by_value: Sequence[tuple[str, str]], tensors: pd.DataFrame) -> list[Finding]:
    """One ``renamed`` finding per prefix rule (with an example and how many kept their values), one per pair
    matched by equal values."""
    out = []
    renamed = tensors[
        (tensors["name"] != tensors["name_b"]) & (tensors["name"] != "") & (tensors["name_b"] != "")
    ]
    for old, new, count in rules:
        rows = renamed[renamed["name"].str.startswith(old) & renamed["name_b"].str.startswith(new)]
        equal = int((rows["bitwise_equal"] == True).sum())  # noqa: E712 - a column of objects
        example = f"{rows['name'].iloc[0]} -> {rows['name_b'].iloc[0]}" if len(rows) else ""
        out.append(
            Finding(
                "renamed",
                "info",
                old.rstrip(".") or new.rstrip("."),
                f"{sb.label} {_prefix_text(old, new)} on {count} tensors (e.g. {example}); {equal} of "
                f"them hold the same bits. This is what torch.compile ('_orig_mod.'), DDP ('module.') "
                "or a wrapper model ('model.') write; the tensors were compared under the mapping",
            )
        )
    for na, nb in by_value:
        out.append(
            Finding(
                "renamed",
                "info",
                na,
                f"{na} in {sa.label} is {nb} in {sb.label}: same shape, dtype and bits under another name",
            )
        )
    return out


def _named(code: str, severity: str, names: list[str], text: str) -> list[Finding]:
    out = [Finding(code, severity, n, text.format(name=n)) for n in names[:_MAX_NAMED]]  # type: ignore[arg-type]
    if len(names) > _MAX_NAMED:
        out.append(Finding(code, severity, "", f"... and {len(names) - _MAX_NAMED} more tensors like "  # type: ignore[arg-type]
                           f"{names[0]}: " + text.format(name="each")))
    return out


def lone_findings(
    sa: TensorSource, sb: TensorSource, tensors: pd.DataFrame, stored_once: set[str]
) -> list[Finding]:
    """``missing`` (only in A) and ``extra`` (only in B), leaving out names a file stores once through a
    tie."""
    missing = [n for n in tensors.loc[tensors["status"] == "missing", "name"] if n not in stored_once]
    extra = [n for n in tensors.loc[tensors["status"] == "extra", "name_b"] if n not in stored_once]
    return (_named("missing", "warning", missing, f"{{name}} is in {sa.label} but not in {sb.label}")
            + _named("extra", "warning", extra, f"{{name}} is in {sb.label} but not in {sa.label}"))


def _bits(dtype: torch.dtype) -> int:
    return round(-math.log2(torch.finfo(dtype).eps)) + 1


def dtype_findings(sa: TensorSource, sb: TensorSource, tensors: pd.DataFrame) -> list[Finding]:
    """One ``dtype-changed`` finding per (A dtype, B dtype): how many tensors, the precision lost."""
    out = []
    changed = tensors[tensors["status"] == "dtype-changed"]
    for (da, db), rows in changed.groupby(["dtype_a", "dtype_b"], sort=False):
        ta, tb = getattr(torch, da), getattr(torch, db)
        worst = rows.loc[rows["rel_change"].fillna(math.inf).idxmax()]
        text = f"{len(rows)} tensors are {da} in {sa.label} and {db} in {sb.label}"
        if (
            ta.is_floating_point
            and tb.is_floating_point
            and tb.itemsize <= ta.itemsize
            and _bits(tb) < _bits(ta)
        ):
            exact = int(rows["exact_cast"].fillna(False).astype(bool).sum())
            text += (
                f": {db} keeps {_bits(tb)} significant bits of {da}'s {_bits(ta)} (each value rounded by "
                "up to "
                f"{torch.finfo(tb).eps / 2:.2g} of itself). The largest change is {worst['max_abs']:.3g} and "
                f"‖B−A‖/‖A‖ is up to {worst['rel_change']:.3g} (in {worst['name']}); "
            )
            text += (
                f"B is exactly A rounded to {db}"
                if exact == len(rows)
                else f"{len(rows) - exact} of them differ from A rounded to {db}: "
                "they changed beyond the conversion"
            )
            severity = "warning"
        elif ta.is_floating_point != tb.is_floating_point:
            text += "; one side is not floating-point, so the values were cast for the comparison"
            severity = "error"
        else:
            text += f"; the largest change is {worst['max_abs']:.3g} (in {worst['name']})"
            severity = "info"
        out.append(Finding("dtype-changed", severity, str(worst["name"]), text))  # type: ignore[arg-type]
    return out


def device_findings(sa: TensorSource, sb: TensorSource, tensors: pd.DataFrame) -> list[Finding]:
    """One ``device-changed`` info per (A device, B device)."""
    moved = tensors[tensors["device_a"].notna() & tensors["device_b"].notna()
                    & (tensors["device_a"] != tensors["device_b"])]
    return [
        Finding(
            "device-changed",
            "info",
            str(rows["name"].iloc[0]),
            f"{len(rows)} tensors are on {da} in {sa.label} and on {db} in {sb.label}",
        )
        for (da, db), rows in moved.groupby(["device_a", "device_b"], sort=False)
    ]
