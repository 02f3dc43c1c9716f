"""``check_step``'s run file (``run.jsonl``): the typed step record and its reader.

- :mod:`.record`: :class:`CheckRecord` and its parts, built from every rank's numbers and written
  as one JSON line per step (format ``inspector-distributed``, versioned);
- :mod:`.run`: :func:`read_check_run` / :func:`parse_run` read a file back as a
  :class:`DistributedRun` (tables of steps, ranks and tensors), and the findings a run holds.

It needs no process group: the report, the Training page and ``compare`` read run files here,
below the analyses; :mod:`inspector.distributed` writes them.
"""

from __future__ import annotations

from .record import CheckRecord, RankNumbers, StepTotals, TensorRow
from .run import (
    DistributedRun,
    is_run_file,
    parse_run,
    rank_issues,
    read_check_run,
    read_run,
    unique_findings,
    unsynchronised,
)

__all__ = ["CheckRecord", "DistributedRun", "RankNumbers", "StepTotals", "TensorRow", "is_run_file",
           "parse_run", "rank_issues", "read_check_run", "read_run", "unique_findings", "unsynchronised"]
