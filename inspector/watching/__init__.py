"""Watch a training run step by step: ``with watch(model, optimizer, "run.inspect") as w: ...``.

Every step records per-module gradient and parameter norms, learning rates, step time and
memory into an Arrow run file (:mod:`.record`) that :func:`read_run` reads, also while it
grows; findings (``nonfinite-forward``, ``dead-gradient``, ...) name the module and the step.
"""

from __future__ import annotations

from .captured import captures_path, load_captures, producer_of, read_captures, save_captures
from .core import Watch, WatchResult, watch
from .record import FORMAT, META_KEY, VERSION, RunMeta, RunWriter, StepRecord, record_batch, schema
from .run import MODULE_COLUMNS, STEP_COLUMNS, Run, StepFinding, is_watch_file, parse_run_bytes, read_run
from .summary import finding_counts, first_findings, main_steps
from .synthetic import synthetic_run
from .train import OPTIMIZERS, make_optimizer, train_watched

__all__ = [
    "FORMAT",
    "VERSION",
    "MODULE_COLUMNS",
    "STEP_COLUMNS",
    "Run",
    "RunMeta",
    "RunWriter",
    "StepFinding",
    "StepRecord",
    "is_watch_file",
    "parse_run_bytes",
    "read_run",
    "record_batch",
    "schema",
    "synthetic_run",
    "Watch",
    "WatchResult",
    "watch",
    "finding_counts",
    "first_findings",
    "main_steps",
    "OPTIMIZERS",
    "make_optimizer",
    "train_watched",
    "captures_path",
    "load_captures",
    "producer_of",
    "read_captures",
    "save_captures",
    "META_KEY",
]
