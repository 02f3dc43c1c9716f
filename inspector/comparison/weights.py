"""``compare_weights``: one pass over two sides, one tensor of each in memory at a time."""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import pandas as pd
import torch

from ..utils.budget import check_budget
from .findings import weight_findings
from .kernels import StatsStream, pair_stats, stream_dtype
from .names import pair_names
from .opening import Spec, open_source
from .result import MODULE_COLUMNS, TENSOR_COLUMNS, WeightComparison
from .sources import Meta, TensorSource
from .summary import summary_line

Progress = Callable[[str], None]
T = TypeVar("T")
_MAX_VALUE_MATCHES = 1024


def compare_weights(
    a: Spec, b: Spec, *, device: str = "cpu", progress: Progress | None = None,
    expect_unchanged: Sequence[str] = (),
) -> WeightComparison:
    """What changed from ``a`` to ``b``, tensor by tensor; see :func:`inspector.compare`."""
    with open_source(a, device) as sa, open_source(b, device) as sb:
        return compare_sides(sa, sb, progress, expect_unchanged=expect_unchanged)


def compare_sides(sa: TensorSource, sb: TensorSource, progress: Progress | None = None, *,
                  expect_unchanged: Sequence[str] = ()) -> WeightComparison:
    """Compare two open sides (:func:`open_source`); neither is changed. ``expect_unchanged``: glob
    patterns of names (or their module prefixes) meant to stay, reported as info."""
    shared_state = sa.state_names & sb.state_names  # the rest of a training state is never missing/extra
    pairing = pair_names(
        {n: m for n, m in sa.entries.items() if n not in sa.state_names or n in shared_state},
        {n: m for n, m in sb.entries.items() if n not in sb.state_names or n in shared_state})
    rows: dict[str, dict[str, Any]] = {}
    read = 0
    for i, (na, nb) in enumerate(pairing.pairs):
        check_budget()
        if progress is not None and i % 100 == 0:
            progress(f"comparing tensor {i + 1} of {len(pairing.pairs)}: {na}")
        if i + 1 < len(pairing.pairs):  # the disk reads the next pair while this one is compared
            sa.prefetch(pairing.pairs[i + 1][0])
            sb.prefetch(pairing.pairs[i + 1][1])
        rows[na] = pair_row(sa, sb, na, nb)
        read += _nbytes(sa.entries[na]) + _nbytes(sb.entries[nb])
    by_value = match_by_value(sa, sb, pairing.missing, pairing.extra)
    for na, nb in by_value:
        rows[na] = pair_row(sa, sb, na, nb)
    matched_b = {nb for _, nb in by_value}
    for na in pairing.missing:
        if na not in rows:
            rows[na] = _lone_row(na, "", sa.entries[na], None, na in sa.trainable)
    ordered = [rows[n] for n in sa.display_order() if n in rows]
    extra = set(pairing.extra) - matched_b
    ordered += [_lone_row("", nb, None, sb.entries[nb], False) for nb in sb.display_order() if nb in extra]
    tensors = pd.DataFrame(ordered, columns=TENSOR_COLUMNS)
    tensors["update_rank"] = tensors["update_rank"].astype("Int64")  # None where not low-rank
    renamed = tuple(
        (r["name"], r["name_b"]) for r in ordered if r["name"] and r["name_b"] and r["name"] != r["name_b"]
    )
    paired_a, paired_b = [na for na, _ in pairing.pairs], [nb for _, nb in pairing.pairs]
    still_missing = [n for n in pairing.missing if rows[n]["status"] == "missing"]
    twice = [("A", kept, lone) for kept, lone in value_ties(sa, still_missing, paired_a)]
    twice += [("B", kept, lone) for kept, lone in value_ties(sb, sorted(extra), paired_b)]
    findings, stored_once = weight_findings(sa, sb, tensors, pairing.rules, by_value, expect_unchanged, twice)
    once = (((tensors["status"] == "missing") & tensors["name"].isin(stored_once))
            | ((tensors["status"] == "extra") & tensors["name_b"].isin(stored_once)))
    tensors.loc[once, "status"] = "stored-once"  # the other side holds it under its tie's other name
    compared = tensors[tensors["bitwise_equal"].notna()]
    state = tensors["name"].isin(shared_state)  # optimizer state and extras of two training checkpoints
    facts = {
        "tensors_a": len(sa.entries),
        "tensors_b": len(sb.entries),
        "compared": len(compared),
        "changed": int((compared["bitwise_equal"] == False).sum()),  # noqa: E712 - a column of objects
        "equal": int((compared["bitwise_equal"] == True).sum()),  # noqa: E712
        "missing": int((tensors["status"] == "missing").sum()),
        "extra": int((tensors["status"] == "extra").sum()),
        "renamed": len(renamed),
        "stored_once": int(once.sum()),
        "bytes_read": read,
        "low_rank": int(tensors["update_rank"].notna().sum()),
        "summary": summary_line(tensors[~state]),
        "state_compared": int(state.sum()),
        "state_changed": int((state & (tensors["bitwise_equal"] == False)).sum()),  # noqa: E712
    }
    return WeightComparison(
        sa.label, sb.label, sa.kind, sb.kind, tensors, module_table(tensors), tuple(findings), renamed, facts
    )


def _nbytes(meta: Meta) -> int:
    return math.prod(meta.shape) * meta.dtype.itemsize


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _lone_row(na: str, nb: str, ma: Meta | None, mb: Meta | None, trainable: bool) -> dict[str, Any]:
    meta = ma or mb
    assert meta is not None
    return {
        "name": na,
        "name_b": nb,
        "status": "missing" if ma else "extra",
        "module": (na or nb).rpartition(".")[0],
        "shape_a": ma.shape if ma else None,
        "shape_b": mb.shape if mb else None,
        "dtype_a": _dtype_name(ma.dtype) if ma else None,
        "dtype_b": _dtype_name(mb.dtype) if mb else None,
        "device_a": ma.device if ma else None,
        "device_b": mb.device if mb else None,
        "numel": math.prod(meta.shape),
        "trainable": trainable,
        "bitwise_equal": None,
        "max_abs": math.nan,
        "rel_change": math.nan,
        "diff_norm": math.nan,
        "norm_a": math.nan,
        "nonfinite_a": 0,
        "nonfinite_b": 0,
        "exact_cast": None,
        "update_rank": None,
    }


def pair_row(sa: TensorSource, sb: TensorSource, na: str, nb: str) -> dict[str, Any]:
    """The row of one pair: metadata, then values where shapes match and both sides hold values."""
    ma, mb = sa.entries[na], sb.entries[nb]
    row = _lone_row(na, nb, ma, mb, na in sa.trainable)
    row["shape_b"], row["dtype_b"], row["device_b"] = mb.shape, _dtype_name(mb.dtype), mb.device
    if ma.shape != mb.shape:
        row["status"] = "shape-changed"
        return row
    if "meta" in (ma.device, mb.device):
        row["status"] = "no-values"
        return row
    if ma.dtype != mb.dtype and (ma.dtype.is_complex or mb.dtype.is_complex):
        stats, update_rank = pair_stats(sa.read(na).clone(), sb.read(nb)), None
        row["exact_cast"] = False
    else:
        stream = StatsStream(stream_dtype(ma.dtype), stream_dtype(mb.dtype), ma.shape)
        pairs = zip(sa.chunks(na), sb.chunks(nb), strict=True)
        for ca, cb in (read_ahead(pairs) if sa.streams or sb.streams else pairs):
            check_budget()
            stream.add(ca, cb)
        stats, update_rank = stream.finish(), stream.update_rank()
        if stream.cast:
            row["exact_cast"] = stream.exact
    if ma.dtype != mb.dtype:
        row["status"] = "dtype-changed"
    else:
        row["status"] = "equal" if stats.bitwise_equal else "changed"
    row["update_rank"] = update_rank
    row.update(bitwise_equal=stats.bitwise_equal, max_abs=stats.max_abs, rel_change=stats.rel_change,
               diff_norm=stats.diff_norm, norm_a=stats.norm_a, nonfinite_a=stats.nonfinite_a,
               nonfinite_b=stats.nonfinite_b)
    return row


def read_ahead(items: Iterator[T]) -> Iterator[T]:
    """``items``, produced one step ahead in a thread: the next chunks are read from the disk while
    this one is compared (file reads and numpy both let other threads run). The producer stops
    when the consumer does; its exception is raised here."""
    done = object()
    slot: queue.Queue[Any] = queue.Queue(maxsize=1)
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in items:
                while not stop.is_set():
                    try:
                        slot.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slot.put(done)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            slot.put(exc)

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    try:
        while (item := slot.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():
            try:
                slot.get(timeout=0.1)
            except queue.Empty:
                pass
        worker.join()


def match_by_value(sa: TensorSource, sb: TensorSource, missing: Sequence[str],
                   extra: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs of a name only in A and one only in B whose tensors have one shape, dtype and the same bits
    (tensors whose elements are all equal are left out: every initial LayerNorm weight would match), and
    a lone pair (the one name only in A, the one only in B) with one shape, dtype and the same bits even
    when its elements are all equal: nothing else could have gone there (an untrained ``ln_f.weight``
    saved as ``ln_final.weight``)."""
    if len(missing) == 1 and len(extra) == 1:
        na, nb = missing[0], extra[0]
        ma, mb = sa.entries[na], sb.entries[nb]
        if ((ma.shape, ma.dtype) == (mb.shape, mb.dtype) and "meta" not in ma.device + mb.device
                and pair_stats(sa.read(na), sb.read(nb)).bitwise_equal):
            return [(na, nb)]
        return []
    return _same_bits(sa, missing, sb, extra, reuse=False)


def value_ties(side: TensorSource, lone: Sequence[str], paired: Sequence[str]) -> list[tuple[str, str]]:
    """(paired name, lone name) pairs of a file that holds one tensor under both names (equal bits, not
    constant): a tie saved twice, where the other side stores it once. Models declare their ties."""
    if side.is_model or not lone:
        return []
    return [(other, name) for name, other in _same_bits(side, lone, side, paired, reuse=True, tries=8)]


def _same_bits(sa: TensorSource, names_a: Sequence[str], sb: TensorSource, names_b: Sequence[str], *,
               reuse: bool, tries: int | None = None) -> list[tuple[str, str]]:
    """``(name in A, name in B)`` for each of ``names_a`` whose tensor has the bits of one of ``names_b``
    (same shape and dtype, not constant), at most ``_MAX_VALUE_MATCHES`` reads in all and ``tries``
    candidates per name; ``reuse=False``: a name of B pairs once."""
    groups: dict[tuple, list[str]] = {}
    for nb in names_b:
        m = sb.entries[nb]
        if "meta" not in m.device:
            groups.setdefault((m.shape, m.dtype), []).append(nb)
    out: list[tuple[str, str]] = []
    budget = _MAX_VALUE_MATCHES
    for na in names_a:
        check_budget()
        m = sa.entries[na]
        candidates = groups.get((m.shape, m.dtype), [])
        if not candidates or "meta" in m.device or budget <= 0:
            continue
        ta = sa.read(na).clone()
        if _constant(ta):
            continue  # all ones or all zeros: equal bits say nothing about where it went
        for nb in candidates[:tries]:
            budget -= 1
            if pair_stats(ta, sb.read(nb)).bitwise_equal:
                out.append((na, nb))
                if not reuse:
                    candidates.remove(nb)
                break
    return out


def _constant(t: torch.Tensor) -> bool:
    flat = t.reshape(-1)
    return flat.numel() < 2 or bool((flat == flat[0]).all())


def module_table(tensors: pd.DataFrame) -> pd.DataFrame:
    """Per module prefix of A's names (model order): compared tensors, changed ones, summed norms."""
    acc: dict[str, list[float]] = {}
    for row in tensors.itertuples(index=False):
        if not row.name or row.bitwise_equal is None:
            continue
        parts = row.name.split(".")[:-1]
        for depth in range(1, len(parts) + 1):
            entry = acc.setdefault(".".join(parts[:depth]), [float(depth), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
            entry[1] += 1
            entry[2] += 0 if row.bitwise_equal else 1
            entry[3] += row.numel
            entry[4] += row.diff_norm ** 2
            entry[5] += row.norm_a ** 2
            entry[6] = max(entry[6], row.max_abs) if not math.isnan(row.max_abs) else math.nan
    rows = []
    for module, (level, count, changed, numel, sq_d, sq_a, max_abs) in acc.items():
        diff, norm = math.sqrt(sq_d), math.sqrt(sq_a)
        rel = 0.0 if diff == 0 else (diff / norm if norm else math.nan)
        rows.append((module, int(level), int(count), int(changed), int(numel), diff, norm, rel, max_abs))
    return pd.DataFrame(rows, columns=MODULE_COLUMNS)
