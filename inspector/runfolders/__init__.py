"""Runs folders, as ``tensorboard --logdir`` has them: the folders the dashboard lists runs from
and the only places (with its upload folder) it opens a typed run path from.

- ``access``: :func:`runs_dirs` (``--runs`` / ``INSPECTOR_RUNS``), :func:`allowed_run_path`;
- ``listing``: :func:`list_runs` (newest first, live ones marked), :func:`describe` (with a
  :class:`RunSummary` kept between calls, a growing run's row reads only its new steps),
  :func:`first_finding`.
"""

from __future__ import annotations

from .access import FLAG, RUNS_ENV, allowed_run_path, refusal, runs_dirs, split_dirs
from .listing import LIVE_S, RunEntry, RunSummary, describe, first_finding, list_runs

__all__ = ["FLAG", "LIVE_S", "RUNS_ENV", "RunEntry", "RunSummary", "allowed_run_path", "describe",
           "first_finding", "list_runs", "refusal", "runs_dirs", "split_dirs"]
