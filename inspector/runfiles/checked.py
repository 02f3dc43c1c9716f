"""A ``check_step`` run as a :class:`~.tables.Run`: its records (per rank and per tensor) in the tables a
watched run has, the records themselves kept as :attr:`Run.check_run <.tables.Run.check_run>`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..sharding.findings import ranks_of
from .columns import RunMeta, StepRecord, record_batch, schema
from .run import DistributedRun
from .tables import Run, StepFinding, _steps_frame


def check_as_run(dr: DistributedRun) -> Run:
    """``dr`` as a :class:`Run` of kind ``"check"``: its parameters grouped into their modules, each
    module's gradient norm the global one (as a watch file stores it), one row of ``steps`` per (step,
    rank) whose ``grad_norm`` is the whole model's (as in a watched run; each rank's own pieces' norm
    is in ``per_rank``), each finding with the rank it is about (the first of several, the one at fault;
    None for the whole world), the file's notes (``run-file-truncated``, ``run-file-newer``) among the
    findings, and ``dr`` kept as ``check_run`` (``per_rank``, ``totals``, ``tensors``, ``backend``
    read it)."""
    params = [t.name for t in dr.checks[0].tensors if t.kind == "parameter"]
    index: dict[str, int] = {}  # each module's place, in the order of first appearance
    owner = [index.setdefault(p.rpartition(".")[0], len(index)) for p in params]
    modules = list(index)
    meta = RunMeta(model=dr.path, world_size=dr.world_size, every=1, modules=tuple(modules),
                   parameters=tuple(params), parameter_modules=tuple(owner), checks=("distributed",),
                   note=dr.checks[0].note or "", kind="check")
    owners = np.asarray(owner, dtype=np.int64)
    records = []
    for check in dr.checks:  # each record as JSON, one at a time (none kept: the records are)
        rec = check.to_json()
        by_name = {t["name"]: t for t in rec["tensors"]}
        norms = np.array([_global_norm(by_name.get(p)) for p in params], dtype=np.float64)
        total = (rec.get("global") or {}).get("grad_norm")
        mod_sq = np.zeros(len(modules))
        np.add.at(mod_sq, owners, np.nan_to_num(norms, nan=0.0) ** 2)
        for r in rec["ranks"]:
            rank = r["rank"]
            nonfinite = np.zeros(len(modules), dtype=np.int32)
            for i, p in enumerate(params):
                nonfinite[owner[i]] += sum(_at_rank(by_name.get(p), k, rank) for k in ("nan", "inf"))
            records.append(StepRecord(
                step=rec["step"], rank=rank, time=float(rec.get("time") or 0.0), grad_norm=total,
                nonfinite=int(r.get("nonfinite") or 0), device_allocated=r.get("device_allocated"),
                device_peak=r.get("device_peak"), rss=r.get("rss"), module_grad_norm=np.sqrt(mod_sq),
                module_nonfinite=nonfinite, param_grad_norm=norms))
    import pyarrow as pa

    table = (pa.Table.from_batches([record_batch(records, "check")]) if records
             else schema().empty_table())
    # each finding on the rank it is about (the first of several: the one at fault), as the watch places it
    findings = [StepFinding(step, (ranks_of(f) or (None,))[0], f.code, f.severity, f.where, f.message)
                for step, f in dr.findings]
    complete = not any(f.code == "run-file-truncated" for f in findings)
    return Run(dr.path, meta, _steps_frame(table), findings, complete, table, check_run=dr)


def _global_norm(tensor: dict[str, Any] | None) -> float:
    """A tensor's global gradient norm (NaN when not recorded)."""
    value = (tensor or {}).get("grad_norm")
    return np.nan if value is None else float(value)


def _at_rank(tensor: dict[str, Any] | None, key: str, rank: int) -> int:
    """``tensor[key][rank]``, 0 where the list is absent or shorter."""
    values = (tensor or {}).get(key) or []
    return int(values[rank] or 0) if rank < len(values) else 0
