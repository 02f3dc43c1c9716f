"""``check_step``'s step record and its reader.

- :mod:`.record`: :class:`CheckRecord` and its parts, built from every rank's numbers (format
  ``inspector-distributed``, versioned), and its Arrow type (:func:`~.record.check_type`): the
  ``check`` column of the run file the watch writes too (``inspector.watching.record``), where
  ``check_step`` appends one row per step; older versions wrote one JSON line per step;
- :mod:`.run`: :func:`read_check_run` reads either back (:func:`parse_check_stream` /
  :func:`parse_run` from bytes or text) as a :class:`DistributedRun` (tables of steps, ranks and
  tensors), which ``inspector.read_run`` (the one reader of run files) keeps as ``Run.check_run``,
  and the findings a run holds.

It needs no process group: the report, the Training page and ``compare`` read run files here,
below the analyses; :mod:`inspector.distributed` writes them.
"""

from __future__ import annotations

from .record import CheckRecord, RankNumbers, StepTotals, TensorRow
from .run import (
    DistributedRun,
    is_run_file,
    parse_check_stream,
    parse_run,
    rank_issues,
    read_check_run,
    records_of,
    unique_findings,
    unsynchronised,
)

__all__ = ["CheckRecord", "DistributedRun", "RankNumbers", "StepTotals", "TensorRow", "is_run_file",
           "parse_check_stream", "parse_run", "rank_issues", "read_check_run", "records_of",
           "unique_findings", "unsynchronised"]
