"""Reading the JSON-lines file ``check_step`` writes: one record per step, merged over ranks."""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..findings import Finding, InspectorError
from .check import FORMAT
from .findings import unsynchronised

RANK_COLUMNS = ["step", "rank", "grad_norm", "nonfinite", "param_numel", "param_bytes", "grad_bytes",
                "buffer_bytes", "device_allocated", "device_peak", "rss", "peak_rss"]
TENSOR_COLUMNS = ["name", "kind", "placements", "mesh", "shape", "numel", "local_numel", "grad_norm",
                  "local_grad_norm", "nan", "inf"]


@dataclass(frozen=True)
class DistributedRun:
    """The steps of one distributed run, as tables.

    ``per_rank``: one row per (step, rank) with columns ``RANK_COLUMNS``; ``steps``: one row
    per step (``step, grad_norm, nonfinite, findings``); ``tensors``: the last step's tensors
    (``TENSOR_COLUMNS``); ``findings``: ``(step, Finding)`` pairs in file order.
    """

    path: str
    world_size: int
    backend: str
    records: list[dict[str, Any]] = field(repr=False)
    per_rank: pd.DataFrame = field(repr=False)
    steps: pd.DataFrame = field(repr=False)
    tensors: pd.DataFrame = field(repr=False)
    findings: list[tuple[int, Finding]] = field(default_factory=list)

    def tensors_at(self, step: int) -> pd.DataFrame:
        """The tensors table of ``step`` (the last record with that step number)."""
        for rec in reversed(self.records):
            if rec["step"] == step:
                return _tensor_frame(rec)
        raise InspectorError(f"{self.path} has no step {step}; steps: {self.steps['step'].tolist()}")


def is_run_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` starts with a ``check_step`` record (reads the first line only)."""
    try:
        with open(path, encoding="utf-8") as fh:
            first = fh.readline(1_000_000)
        return json.loads(first).get("format") == FORMAT
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        return False


def read_run(path: str | os.PathLike) -> DistributedRun:
    """Read a run file written by :func:`check_step` (or ``python -m inspector distributed``).

    Raises:
        InspectorError: the file is missing, empty, or a line is not a step record (the
            message names the file and the line).
    """
    p = Path(path)
    if not p.is_file():
        raise InspectorError(f"run file {p} does not exist; write it with inspector.distributed.check_step "
                             "or `torchrun ... -m inspector distributed ... -o FILE`")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InspectorError(f"run file {p.name} cannot be read as UTF-8 text ({exc})") from None
    return parse_run(text, p.name)


def parse_run(text: str, name: str = "run file") -> DistributedRun:
    """Like :func:`read_run`, from the file's text (an upload)."""
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise InspectorError(f"{name} line {number} is not JSON ({exc}); a run file holds one "
                                 "check_step record per line") from None
        if not isinstance(rec, dict) or rec.get("format") != FORMAT:
            raise InspectorError(f"{name} line {number} is not a check_step record (no "
                                 f"\"format\": \"{FORMAT}\")")
        missing = [k for k in ("step", "world_size", "ranks", "tensors", "global") if k not in rec]
        if missing:
            raise InspectorError(f"{name} line {number} lacks {', '.join(missing)}")
        problem = _record_problem(rec)
        if problem:
            raise InspectorError(f"{name} line {number} is not a valid check_step record: {problem}")
        records.append(rec)
    if not records:
        raise InspectorError(f"{name} holds no step records")
    rank_rows, step_rows, findings = [], [], []
    for rec in records:
        for r in rec["ranks"]:
            rank_rows.append([rec["step"]] + [r.get(c) for c in RANK_COLUMNS[1:]])
        step_findings = [Finding.from_dict(f) for f in rec.get("findings", [])]
        findings += [(rec["step"], f) for f in step_findings]
        step_rows.append([rec["step"], rec["global"].get("grad_norm"), rec["global"].get("nonfinite", 0),
                          len(step_findings)])
    per_rank = pd.DataFrame(rank_rows, columns=RANK_COLUMNS)
    steps = pd.DataFrame(step_rows, columns=["step", "grad_norm", "nonfinite", "findings"])
    last = records[-1]
    return DistributedRun(name, int(last["world_size"]), str(last.get("backend", "")), records,
                          per_rank, steps, _tensor_frame(last), findings)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _record_problem(rec: dict[str, Any]) -> str:
    """What is wrong with one parsed line's types ("" when nothing): the fields tables, figures,
    pages and reports read, with the types ``check_step`` writes."""
    if not _is_int(rec["step"]):
        return f"step must be an integer, not {rec['step']!r}"
    if not _is_int(rec["world_size"]) or rec["world_size"] < 1:
        return f"world_size must be a positive integer, not {rec['world_size']!r}"
    if not isinstance(rec.get("backend", ""), str) or not isinstance(rec.get("note", ""), str):
        return "backend and note must be strings"
    if not isinstance(rec["global"], dict) or not all(_is_number(v) for v in rec["global"].values()):
        return "global must be an object of numbers"
    if not isinstance(rec["ranks"], list) or not all(isinstance(r, dict) for r in rec["ranks"]):
        return "ranks must be a list of objects"
    for r in rec["ranks"]:
        if not _is_int(r.get("rank")) or not 0 <= r["rank"] < rec["world_size"]:
            return f"each rank's \"rank\" must be an integer from 0 to world_size - 1, not {r.get('rank')!r}"
        bad = [c for c in RANK_COLUMNS[2:] if not _is_number(r.get(c))]
        bad += [c for c in ("param_numel", "param_bytes", "grad_bytes", "buffer_bytes") if not _is_int(r.get(c))]
        if bad:
            return f"rank {r['rank']} has a non-numeric {bad[0]}"
    if not isinstance(rec["tensors"], list) or not all(
            isinstance(t, dict) and isinstance(t.get("name"), str) for t in rec["tensors"]):
        return "tensors must be a list of objects, each with a string name"
    for t in rec["tensors"]:
        if not all(isinstance(t.get(k, []), list) for k in ("nan", "inf", "replica_key", "hash")):
            return f"tensor {t['name']!r}: nan, inf, replica_key and hash must be lists"
    findings = rec.get("findings", [])
    if not isinstance(findings, list):
        return "findings must be a list"
    for f in findings:
        try:
            Finding.from_dict(f)
        except ValueError as exc:
            return str(exc)
    return ""


def _tensor_frame(record: dict[str, Any]) -> pd.DataFrame:
    rows = [[t.get(c) for c in TENSOR_COLUMNS] for t in record["tensors"]]
    return pd.DataFrame(rows, columns=TENSOR_COLUMNS)


def unique_findings(run: DistributedRun) -> list[tuple[list[int], Finding]]:
    """Each distinct finding once, with the steps it was seen at (first step first)."""
    seen: dict[tuple[str, str, str], tuple[list[int], Finding]] = {}
    for step, f in run.findings:
        key = (f.code, f.severity, f.where)
        if key in seen:
            seen[key][0].append(step)
        else:
            seen[key] = ([step], f)
    return list(seen.values())


def rank_issues(run: DistributedRun, rank: int) -> pd.DataFrame:
    """Where ``rank`` stands out, step by step: ``step, tensor, issue`` with ``issue`` in
    ``"nonfinite gradient"`` (its piece holds NaN/Inf), ``"differs from its replicas"`` (its bits
    differ from the majority of the ranks that must hold the same values), ``"replicas disagree,
    no majority"`` (they differ and no majority says which is right: every one of them is named)
    and ``"gradient not synchronized"`` (a plain parameter whose gradient differs between ranks:
    every rank is named)."""
    rows = []
    for rec in run.records:
        for t in rec["tensors"]:
            nan, inf = t.get("nan", []), t.get("inf", [])
            if (rank < len(nan) and nan[rank]) or (rank < len(inf) and inf[rank]):
                rows.append((rec["step"], t["name"], "nonfinite gradient"))
            drift = _replica_issue(t, rank)
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
