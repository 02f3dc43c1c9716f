"""Reading what ``check_step`` writes: one record per step, merged over ranks, from the Arrow run file
(its ``check`` column; the file :func:`inspector.read_run` reads) or the JSON lines of older versions."""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd

from ..sharding.findings import about
from ..utils.findings import Finding, InspectorError, group_findings
from .guard import regular_fd
from .jsonlines import (
    MAX_JSONL_BYTES,
    MAX_JSONL_RECORDS,
    count_lines,
    file_lines,
    loads,
    parse_lines,
    text_line_count,
    text_lines,
    too_long,
    too_many,
)
from .record import FORMAT, RANK_NUMBERS, CheckRecord
from .stream import STREAM_MAGIC, RunStream
from .tail import RunTail, read_all, read_header

RANK_COLUMNS = ["step", "rank", *RANK_NUMBERS]
TENSOR_COLUMNS = ["name", "kind", "placements", "mesh", "shape", "numel", "local_numel", "grad_norm",
                  "local_grad_norm", "nan", "inf"]


@dataclass(frozen=True)
class DistributedRun:
    """The steps of one distributed run, as tables.

    ``per_rank``: one row per (step, rank) with columns ``RANK_COLUMNS``; ``steps``: one row
    per step (``step, grad_norm, nonfinite, findings``); ``tensors``: the last step's tensors
    (``TENSOR_COLUMNS``); ``findings``: ``(step, Finding)`` pairs in file order; ``checks``: the
    step records as read (:class:`~.record.CheckRecord`), ``records`` the same as JSON objects.
    """

    path: str
    world_size: int
    backend: str
    checks: list[CheckRecord] = field(repr=False)
    per_rank: pd.DataFrame = field(repr=False)
    steps: pd.DataFrame = field(repr=False)
    tensors: pd.DataFrame = field(repr=False)
    findings: list[tuple[int, Finding]] = field(default_factory=list)

    @cached_property
    def records(self) -> list[dict[str, Any]]:
        """The step records as JSON objects (:meth:`~.record.CheckRecord.to_json`), in file order."""
        return [rec.to_json() for rec in self.checks]

    def tensors_at(self, step: int) -> pd.DataFrame:
        """The tensors table of ``step`` (the last record with that step number)."""
        for rec in reversed(self.checks):
            if rec.step == step:
                return _tensor_frame(rec)
        raise InspectorError(f"{self.path} has no step {step}; steps: {self.steps['step'].tolist()}")


_PREFIX = re.compile(r'\s*\{\s*"format"\s*:\s*"' + FORMAT + '"')
_FIRST_LINE_LIMIT = 64 << 20  # a first line this long is not parsed to tell what the file is


def is_run_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` starts with a ``check_step`` record.

    The writer puts ``"format"`` first, so the first bytes tell (a record of thousands of
    ranks is megabytes long); a file that starts otherwise has its first line parsed.
    """
    try:
        with os.fdopen(regular_fd(path), "rb") as fh:  # a FIFO or device is refused before it is opened
            head = fh.read(4096)
            if head[:4] == STREAM_MAGIC:
                return read_header(path).meta.kind == "check"
            if _PREFIX.match(head.decode("utf-8", errors="ignore").lstrip("\ufeff")):
                return True
            fh.seek(0)
            first = fh.readline(_FIRST_LINE_LIMIT).decode("utf-8-sig")
        return loads(first).get("format") == FORMAT
    except (OSError, ValueError, AttributeError, UnicodeDecodeError, RecursionError):
        return False


def read_check_run(path: str | os.PathLike) -> DistributedRun:
    """Read a run file written by :func:`check_step` (or ``python -m inspector distributed``): the records
    ``inspector.read_run`` keeps as ``Run.check_run`` (read a run with that).

    Raises:
        InspectorError: the file is missing, empty, or a line is not a step record (the
            message names the file and the line). A last line cut short (a run that was
            stopped while writing) is left out with a ``run-file-truncated`` finding.
    """
    p = Path(path)
    if not p.exists():
        raise InspectorError(f"run file {p} does not exist; write it with inspector.distributed.check_step "
                             "or `torchrun ... -m inspector distributed ... -o FILE`")
    fd = regular_fd(p)  # a FIFO or device is refused before it is opened
    with os.fdopen(fd, "rb") as fh:
        try:
            if fh.read(4) == STREAM_MAGIC:
                return _check_run(read_all(p), p.name)
            size = os.fstat(fh.fileno()).st_size
            fh.seek(0)
            lines = count_lines(fh) if size <= MAX_JSONL_BYTES else 0
        except OSError as exc:
            raise InspectorError(f"run file {p.name} cannot be read ({exc.strerror or exc})") from None
        if size > MAX_JSONL_BYTES:
            raise InspectorError(too_long(p.name, size))
        if lines > MAX_JSONL_RECORDS:
            raise InspectorError(too_many(p.name, lines))
        return _run(*parse_lines(file_lines(fh, p.name), p.name), p.name)


def _check_run(tail: RunTail, name: str) -> DistributedRun:
    if tail.meta.kind != "check":
        raise InspectorError(f"{name} is not a check_step run file (an Arrow run file of kind check)")
    return check_run_of(RunStream(tail.schema, tail.batches(), tail.offset, tail.cut, tail.closed), name)


def parse_check_stream(data: bytes, name: str = "run file") -> DistributedRun:
    """The ``check_step`` records of an Arrow run file's bytes (its ``check`` column).

    Raises:
        InspectorError: not a ``check_step`` run file, or a record is damaged (the message names the
            file and the step). A last step cut short is left out with a ``run-file-truncated`` finding.
    """
    return _check_run(read_all(data=data, name=name), name)


def check_run_of(stream: RunStream, name: str = "run file") -> DistributedRun:
    """The ``check_step`` records in the ``check`` column of a run file already read
    (:func:`~.stream.read_stream`; ``inspector.read_run`` reads the file once for both kinds).

    Raises:
        InspectorError: the stream has no ``check`` column or no record, or a record is damaged (the
            message names the file and the step). A last step cut short is left out with a
            ``run-file-truncated`` finding.
    """
    if "check" not in stream.schema.names:
        raise InspectorError(f"{name} lacks the check column; it was not written by check_step")
    notes = []
    if stream.cut:
        notes.append(Finding("run-file-truncated", "warning", name,
                             f"the last step of {name} is cut short: the run stopped while writing it. "
                             f"Read {stream.rows} complete steps before it."))
    records = []
    columns = [c for c in ("check", "findings", "finding_ranks") if c in stream.schema.names]
    for batch in stream.batches:
        for row in batch.select(columns).to_pylist():
            if row["check"] is None:
                continue
            try:
                records.append(CheckRecord.from_json({**row["check"], "format": FORMAT,
                                                      "findings": row["findings"] or []}))
            except ValueError as exc:
                step = row["check"].get("step")
                raise InspectorError(f"{name}: step {step!r} is damaged ({exc})") from None
            _with_ranks(records[-1], row.get("finding_ranks"))
    if not records:
        raise InspectorError(f"{name} holds no step records")
    return _run(records, notes, name)


def _with_ranks(record: CheckRecord, ranks: list[Any] | None) -> None:
    """Give each finding of ``record`` the ranks the file says it is about (:func:`about`); ranks
    outside the world are left out, and a list that does not match the findings one to one is not read."""
    if not ranks or len(ranks) != len(record.findings):
        return
    for f, on in zip(record.findings, ranks, strict=True):
        about(f, [r for r in on or () if r is not None and 0 <= r < record.world_size])


def parse_run(text: str, name: str = "run file") -> DistributedRun:
    """Like :func:`read_check_run`, from the file's text (an upload)."""
    if len(text) > MAX_JSONL_BYTES:
        raise InspectorError(too_long(name, len(text)))
    if text_line_count(text) > MAX_JSONL_RECORDS:
        raise InspectorError(too_many(name, text_line_count(text)))
    return _run(*parse_lines(text_lines(text.lstrip("\ufeff")), name), name)


def _run(records: list[CheckRecord], notes: list[Finding], name: str) -> DistributedRun:
    rank_rows, step_rows, findings = [], [], []
    for rec in records:
        for r in rec.ranks:
            rank_rows.append([rec.step] + [getattr(r, c) for c in RANK_COLUMNS[1:]])
        findings += [(rec.step, f) for f in rec.findings]
        step_rows.append([rec.step, rec.totals.grad_norm, rec.totals.nonfinite, len(rec.findings)])
    findings += [(records[-1].step, f) for f in notes]
    per_rank = pd.DataFrame(rank_rows, columns=RANK_COLUMNS)
    steps = pd.DataFrame(step_rows, columns=["step", "grad_norm", "nonfinite", "findings"])
    last = records[-1]
    return DistributedRun(name, int(last.world_size), last.backend, records,
                          per_rank, steps, _tensor_frame(last), findings)


def _tensor_frame(record: CheckRecord) -> pd.DataFrame:
    rows = [[getattr(t, c) for c in TENSOR_COLUMNS] for t in record.tensors]
    return pd.DataFrame(rows, columns=TENSOR_COLUMNS)


def records_of(run: Any) -> DistributedRun:
    """The ``check_step`` records of ``run``: a :class:`DistributedRun` itself, or the ``check_run`` of
    the ``Run`` that ``inspector.read_run`` gives.

    Raises:
        InspectorError: ``run`` is a watched run (it has no ``check_step`` records).
    """
    if isinstance(run, DistributedRun):
        return run
    records = getattr(run, "check_run", None)
    if not isinstance(records, DistributedRun):
        raise InspectorError(f"{getattr(run, 'path', run)} is not a check_step run: it has no per-rank "
                             "and per-tensor records (inspector.distributed.check_step writes them)")
    return records


def unique_findings(run: Any) -> list[tuple[list[int], Finding]]:
    """Each distinct finding of a ``check_step`` run (a ``Run`` of kind ``"check"``) once (by code and
    place, :func:`inspector.utils.findings.group_findings`), with the steps it was seen at (first step
    first)."""
    found = records_of(run).findings
    return [(steps, f) for steps, _, f in group_findings((step, None, f) for step, f in found).values()]


def rank_issues(run: Any, rank: int) -> pd.DataFrame:
    """Where ``rank`` stands out, step by step: ``step, tensor, issue`` with ``issue`` in
    ``"nonfinite gradient"`` (its piece holds NaN/Inf), ``"nonfinite values"`` (the values of its
    piece do), ``"differs from its replicas"`` (its bits differ from the majority of the ranks that
    must hold the same values), ``"replicas disagree, no majority"`` (they differ and no majority
    says which is right: every one of them is named) and ``"gradient not synchronized"`` (a plain
    parameter whose gradient differs between ranks: every rank is named). Buffers that the wrapper
    re-synchronises (DDP's ``broadcast_buffers``) are not counted as drift. ``run``: a ``Run`` of kind
    ``"check"`` (or its ``check_run``)."""
    rows = []
    for check in records_of(run).checks:
        rec = check.to_json()  # one record at a time: the JSON of every record is not kept
        for t in rec["tensors"]:
            nan, inf = t.get("nan", []), t.get("inf", [])
            if (rank < len(nan) and nan[rank]) or (rank < len(inf) and inf[rank]):
                rows.append((rec["step"], t["name"], "nonfinite gradient"))
            vnan, vinf = t.get("value_nan") or [], t.get("value_inf") or []
            if (rank < len(vnan) and vnan[rank]) or (rank < len(vinf) and vinf[rank]):
                rows.append((rec["step"], t["name"], "nonfinite values"))
            drift = "" if t.get("resync") == "buffers" else _replica_issue(t, rank)
            if drift:
                rows.append((rec["step"], t["name"], drift))
            if rank < len(t.get("local_grad_norm") or []) and unsynchronised(t):
                rows.append((rec["step"], t["name"], "gradient not synchronized"))
    return pd.DataFrame(rows, columns=["step", "tensor", "issue"])


def _replica_issue(t: dict[str, Any], rank: int) -> str:
    keys, hashes = t.get("replica_key", []), t.get("hash", [])
    if rank >= len(keys) or keys[rank] < 0 or not hashes:
        return ""
    peers = [tuple(hashes[r]) for r in range(len(keys)) if keys[r] == keys[rank]]
    counts = Counter(peers).most_common()
    if len(counts) < 2:
        return ""
    if counts[0][1] == counts[1][1]:
        return "replicas disagree, no majority"
    return "differs from its replicas" if tuple(hashes[rank]) != counts[0][0] else ""


def unsynchronised(row: dict[str, Any]) -> bool:
    """Whether ``row`` is a plain (not sharded, not DTensor) parameter whose gradient norm differs
    between ranks (by more than 1e-5 relative)."""
    norms = row.get("local_grad_norm") or []
    if (
        row.get("kind") != "parameter"
        or row.get("placements")
        or len(norms) < 2
        or any(v is None for v in norms)
    ):
        return False
    lo, hi = min(norms), max(norms)
    return bool(hi - lo > 1e-5 * max(hi, 1e-30))
