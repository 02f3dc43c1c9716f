"""Runs folders, as ``tensorboard --logdir`` has them: the folders the dashboard lists runs from
and the only places (with its upload folder) it opens a typed run path from.

- ``access``: :func:`runs_dirs` (``--runs`` / ``INSPECTOR_RUNS``), :func:`allowed_run_path`;
  :func:`data_dirs` (``INSPECTOR_DATA_DIRS``), :func:`shared_data_dirs` (a shared server's default) and
  :func:`data_settings` (what ``serve`` sets and says at start);
- ``listing``: :func:`list_runs` (newest first, live ones marked), :func:`describe` (with a
  :class:`RunSummary` kept between calls, a growing run's row reads only its new steps),
  :func:`first_finding`.
"""

from __future__ import annotations

from .access import (
    ANY_FOLDER,
    DATA_ENV,
    FLAG,
    RUNS_ENV,
    allowed_run_path,
    data_dirs,
    data_settings,
    is_loopback,
    listen_address,
    refusal,
    runs_dirs,
    shared_data_dirs,
    split_dirs,
)
from .listing import LIVE_S, RunEntry, RunSummary, describe, first_finding, list_runs

__all__ = ["ANY_FOLDER", "DATA_ENV", "FLAG", "LIVE_S", "RUNS_ENV", "RunEntry", "RunSummary",
           "allowed_run_path", "data_dirs", "data_settings", "describe", "first_finding", "is_loopback",
           "list_runs", "listen_address", "refusal", "runs_dirs", "shared_data_dirs", "split_dirs"]
