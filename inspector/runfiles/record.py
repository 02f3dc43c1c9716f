"""The step record ``check_step`` writes, defined once: :class:`CheckRecord` and its rows.

``check_step`` builds it from the gathered numbers (:func:`build_record`) and rank 0 appends it
to the Arrow run file the watch writes too (its ``check`` column, :func:`.stream.append_check`);
``read_check_run`` reads it back, and reads the JSON lines older versions wrote, one record a line,
with :meth:`CheckRecord.from_json`, which checks the types of everything the tables, figures, pages
and reports read. Fields a record of an older writer lacks read as ``None`` (``[]`` for the per-rank
lists of a tensor); fields this reader does not know are left out.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from ..utils.findings import Finding

FORMAT = "inspector-distributed"
VERSION = 1
# per tensor: local grad sum of squares, grad NaN, grad Inf, local numel, has grad, replica key,
# value NaN, value Inf
PER_TENSOR = 8
# per rank: param bytes, grad bytes, buffer bytes, device allocated, device peak, rss, peak rss, loss,
# has loss
PER_RANK = 9


@dataclass(frozen=True, kw_only=True)
class TensorRow:
    """One parameter or buffer at one step: what does not change between steps (``name`` to
    ``resync``: ``"buffers"`` when the wrapper copies rank 0's buffers before each forward pass),
    then one entry per rank (``local_numel`` to ``hash``: two integers, the hash and the part read)."""

    name: str
    kind: str | None = None
    placements: str | None = None
    mesh: list[int] | None = None
    shape: list[int] | None = None
    numel: int | None = None
    dtype: str | None = None
    requires_grad: bool | None = None
    resync: str | None = None
    has_grad: bool | None = None
    local_numel: list[int] | None = None
    grad_norm: float | None = None
    local_grad_norm: list[float | None] | None = None
    nan: list[int] = field(default_factory=list)
    inf: list[int] = field(default_factory=list)
    value_nan: list[int] | None = None
    value_inf: list[int] | None = None
    replica_key: list[int] = field(default_factory=list)
    hash: list[list[int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kind": self.kind,
            "placements": self.placements,
            "mesh": self.mesh,
            "shape": self.shape,
            "numel": self.numel,
            "dtype": self.dtype,
            "requires_grad": self.requires_grad,
            "resync": self.resync,
            "has_grad": self.has_grad,
            "local_numel": self.local_numel,
            "grad_norm": self.grad_norm,
            "local_grad_norm": self.local_grad_norm,
            "nan": self.nan,
            "inf": self.inf,
            "value_nan": self.value_nan,
            "value_inf": self.value_inf,
            "replica_key": self.replica_key,
            "hash": self.hash,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], world: int) -> TensorRow:
        """Raises ValueError naming the tensor and what is wrong."""
        problem = _tensor_problem(data, world)
        if problem:
            raise ValueError(f"tensor {data['name']!r}: {problem}")
        return cls(**{k: data[k] for k in _TENSOR_FIELDS if k in data})


@dataclass(frozen=True, kw_only=True)
class RankNumbers:
    """One rank at one step: its gradient norm, NaN/Inf counts, sizes, memory and loss."""

    rank: int
    grad_norm: float | None = None
    nonfinite: int | None = None
    value_nonfinite: int | None = None
    param_numel: int
    param_bytes: int
    grad_bytes: int
    buffer_bytes: int
    device_allocated: int | None = None
    device_peak: int | None = None
    rss: int | None = None
    peak_rss: int | None = None
    loss: float | None = None
    loss_finite: bool | None = None

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in _RANK_FIELDS}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RankNumbers:
        return cls(**{k: data[k] for k in _RANK_FIELDS if k in data})


@dataclass(frozen=True, kw_only=True)
class StepTotals:
    """The step over every rank (JSON key ``global``)."""

    grad_norm: float | None = None
    nonfinite: int | None = 0
    param_numel: int | None = 0

    def to_json(self) -> dict[str, Any]:
        return {"grad_norm": self.grad_norm, "nonfinite": self.nonfinite, "param_numel": self.param_numel}


@dataclass(frozen=True, kw_only=True)
class CheckRecord:
    """One ``check_step`` call: one line of a run file. ``format`` comes first in the JSON, so
    the first bytes of a file tell what it is."""

    format: str = FORMAT
    version: int | None = VERSION
    step: int
    time: float | None = None
    world_size: int
    backend: str = ""
    note: str = ""
    totals: StepTotals = field(default_factory=StepTotals)
    ranks: list[RankNumbers] = field(default_factory=list)
    tensors: list[TensorRow] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The JSON object (NaN and Inf as they are; older versions wrote them to their files as null)."""
        return {
            "format": self.format,
            "version": self.version,
            "step": self.step,
            "time": self.time,
            "world_size": self.world_size,
            "backend": self.backend,
            "note": self.note,
            "global": self.totals.to_json(),
            "ranks": [r.to_json() for r in self.ranks],
            "tensors": [t.to_json() for t in self.tensors],
            "findings": [f.to_dict() for f in self.findings],
        }

    @classmethod
    def from_json(cls, data: Any) -> CheckRecord:
        """The record of one parsed line.

        Raises:
            ValueError: not a record (no ``"format": "inspector-distributed"``), a field the
                readers need is missing, or a field has another type than ``check_step`` writes.
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a check_step record (no \"format\": \"{FORMAT}\")")
        missing = [k for k in ("step", "world_size", "ranks", "tensors", "global") if k not in data]
        if missing:
            raise ValueError(f"lacks {', '.join(missing)}")
        problem = _record_problem(data)
        if problem:
            raise ValueError(problem)
        world, totals = data["world_size"], data["global"]
        return cls(format=FORMAT, version=data.get("version"), step=data["step"], time=data.get("time"),
                   world_size=world, backend=data.get("backend", ""), note=data.get("note", ""),
                   totals=StepTotals(grad_norm=totals.get("grad_norm"), nonfinite=totals.get("nonfinite", 0),
                                     param_numel=totals.get("param_numel", 0)),
                   ranks=[RankNumbers.from_json(r) for r in data["ranks"]],
                   tensors=[TensorRow.from_json(t, world) for t in data["tensors"]],
                   findings=[Finding.from_dict(f) for f in data.get("findings", [])])


def check_type() -> Any:
    """The Arrow type of a :class:`CheckRecord` in the run file's ``check`` column: a struct with the
    JSON keys of :meth:`CheckRecord.to_json` (the findings go in the row's own ``findings`` column),
    each part's fields typed from its dataclass (pyarrow is imported on first use)."""
    import pyarrow as pa

    i64, f64, text = pa.int64(), pa.float64(), pa.string()
    scalar = {"str": text, "int": i64, "float": f64, "bool": pa.bool_(), "list[int]": pa.list_(i64),
              "list[float | None]": pa.list_(f64), "list[list[int]]": pa.list_(pa.list_(i64))}

    def struct(cls: type) -> Any:
        return pa.struct([(f.name, scalar[str(f.type).removesuffix(" | None")]) for f in fields(cls)])

    return pa.struct([("version", i64), ("step", i64), ("time", f64), ("world_size", i64),
                      ("backend", text), ("note", text), ("global", struct(StepTotals)),
                      ("ranks", pa.list_(struct(RankNumbers))), ("tensors", pa.list_(struct(TensorRow)))])


_TENSOR_FIELDS = tuple(TensorRow.__dataclass_fields__)
_RANK_FIELDS = tuple(RankNumbers.__dataclass_fields__)
# the numbers of a rank the per-rank table reads; the sizes must be integers
RANK_NUMBERS = ("grad_norm", "nonfinite", "param_numel", "param_bytes", "grad_bytes", "buffer_bytes",
                "device_allocated", "device_peak", "rss", "peak_rss", "value_nonfinite", "loss")
_SIZES = ("param_numel", "param_bytes", "grad_bytes", "buffer_bytes")


def build_record(static: list[dict[str, Any]], holders: list[float], per_tensor: torch.Tensor,
                 per_rank: torch.Tensor, hashes: torch.Tensor, step: int, world: int, backend: str,
                 note: str) -> CheckRecord:
    """The record of one step from every rank's numbers.

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
    total_sq = (
        float(gsq[has_t].sum()) if n else 0.0
    )  # a NaN gradient makes the total NaN, as in clip_grad_norm_
    grad_norm = [math.sqrt(v) if h and v >= 0 else None for v, h in zip(gsq.tolist(), has, strict=True)]
    local = [
        [math.sqrt(v) if h and v >= 0 else None for v in row]
        for row, h in zip(_per_tensor(sq), has, strict=True)
    ]
    nan, inf, numel, keys, vnan, vinf = (_per_tensor(cols[k].long()) for k in (1, 2, 3, 5, 6, 7))
    hs = [
        list(map(list, zip(*pair, strict=True)))
        for pair in zip(*(_per_tensor(hashes[:, :, j].T) for j in range(2)), strict=True)
    ]  # [tensor][rank][2]
    rows = [TensorRow(**fixed, has_grad=has[i], local_numel=numel[i], grad_norm=grad_norm[i],
                      local_grad_norm=local[i], nan=nan[i], inf=inf[i], value_nan=vnan[i],
                      value_inf=vinf[i], replica_key=keys[i], hash=hs[i])
            for i, fixed in enumerate(static)]
    global_nonfinite = int(cols[1].sum() + cols[2].sum()) if n else 0
    is_param = torch.tensor([s["kind"] == "parameter" for s in static], dtype=torch.bool)
    sums = (
        torch.stack(
            [
                sq[is_param].sum(dim=0),
                (cols[1] + cols[2]).sum(dim=0),
                (cols[6] + cols[7]).sum(dim=0),
                cols[3][is_param].sum(dim=0),
            ]
        ).T.tolist()
        if n
        else [[0.0] * 4] * world
    )
    return CheckRecord(
        step=int(step), time=time.time(), world_size=world, backend=backend, note=note,
        totals=StepTotals(grad_norm=math.sqrt(total_sq), nonfinite=global_nonfinite,
                          param_numel=sum(s["numel"] for s in static if s["kind"] == "parameter")),
        ranks=[_rank(r, sums[r], per_rank[r].tolist(), bool(is_param.any())) for r in range(world)],
        tensors=rows)


def _per_tensor(columns: torch.Tensor) -> list[list[Any]]:
    """An (n tensors, world) tensor as n lists of one number per rank (built from rows: fast)."""
    return list(map(list, zip(*columns.T.contiguous().tolist(), strict=True))) if columns.numel() else \
        [[] for _ in range(columns.shape[0])]


def _rank(r: int, sums: list[float], own: list[float], has_params: bool) -> RankNumbers:
    sq, nonfinite, value_nonfinite, numel = sums
    pb, gb, bb, alloc, peak, rss, peak_rss, loss, has_loss = own
    return RankNumbers(
        rank=r,
        grad_norm=math.sqrt(sq) if has_params and sq >= 0 else None,
        nonfinite=int(nonfinite), value_nonfinite=int(value_nonfinite), param_numel=int(numel),
        param_bytes=int(pb), grad_bytes=int(gb), buffer_bytes=int(bb),
        device_allocated=None if math.isnan(alloc) else int(alloc),
        device_peak=None if math.isnan(peak) else int(peak),
        rss=None if math.isnan(rss) else int(rss), peak_rss=int(peak_rss),
        loss=loss if has_loss else None, loss_finite=bool(math.isfinite(loss)) if has_loss else None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _record_problem(rec: dict[str, Any]) -> str:
    """What is wrong with one parsed line's types ("" when nothing): the fields tables, figures,
    pages and reports read, with the types ``check_step`` writes."""
    if not _is_int(rec["step"]):
        return f"step must be an integer, not {rec['step']!r}"
    if not _is_int(rec["world_size"]) or not 1 <= rec["world_size"] <= 1 << 20:
        return f"world_size must be a positive integer, not {rec['world_size']!r}"
    if "version" in rec and not _is_int(rec["version"]):
        return f"version must be an integer, not {rec['version']!r}"
    if not isinstance(rec.get("backend", ""), str) or not isinstance(rec.get("note", ""), str):
        return "backend and note must be strings"
    if not isinstance(rec["global"], dict) or not all(_is_number(v) for v in rec["global"].values()):
        return "global must be an object of numbers"
    if not isinstance(rec["ranks"], list) or not all(isinstance(r, dict) for r in rec["ranks"]):
        return "ranks must be a list of objects"
    for r in rec["ranks"]:
        if not _is_int(r.get("rank")) or not 0 <= r["rank"] < rec["world_size"]:
            return f"each rank's \"rank\" must be an integer from 0 to world_size - 1, not {r.get('rank')!r}"
        bad = [c for c in RANK_NUMBERS if not _is_number(r.get(c))]
        bad += [c for c in _SIZES if not _is_int(r.get(c))]
        if bad:
            return f"rank {r['rank']} has a non-numeric {bad[0]}"
    if not isinstance(rec["tensors"], list) or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) for t in rec["tensors"]):
        return "tensors must be a list of objects, each with a string name"
    for t in rec["tensors"]:
        problem = _tensor_problem(t, rec["world_size"])
        if problem:
            return f"tensor {t['name']!r}: {problem}"
    findings = rec.get("findings", [])
    if not isinstance(findings, list):
        return "findings must be a list"
    for f in findings:
        try:
            Finding.from_dict(f)
        except ValueError as exc:
            return str(exc)
    return ""


_PER_RANK_INTS = ("nan", "inf", "replica_key", "local_numel", "value_nan", "value_inf")


def _tensor_problem(t: dict[str, Any], world: int) -> str:
    """What is wrong with one tensor row ("" when nothing)."""
    if not all(isinstance(t.get(k, []), list) for k in ("nan", "inf", "replica_key", "hash")):
        return "nan, inf, replica_key and hash must be lists"
    for key in _PER_RANK_INTS:
        values = t.get(key)
        if values is not None and (not isinstance(values, list) or not all(_is_int(v) for v in values)):
            return f"{key} must be a list of integers, one per rank"
    if not all(_is_number(v) for v in t.get("local_grad_norm") or []) or not _is_number(t.get("grad_norm")):
        return "grad_norm and local_grad_norm must be numbers"
    if not all(isinstance(h, list) and h and all(_is_int(x) for x in h) for h in t.get("hash", [])):
        return "hash must be a list of integer lists, one per rank"
    keys, hashes = t.get("replica_key", []), t.get("hash", [])
    if len(hashes) < len(keys):
        return f"hash has {len(hashes)} entries for {len(keys)} replica keys: each rank needs one"
    long = [k for k in (*_PER_RANK_INTS, "hash", "local_grad_norm") if len(t.get(k) or []) > world]
    if long:
        return f"{long[0]} has more entries than world_size ({world})"
    return ""
