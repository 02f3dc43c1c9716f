"""Watch a training run step by step: ``with watch(model, optimizer, "run.inspect") as w: ...``.

Every step records per-module gradient and parameter norms, learning rates, step time and
memory into an Arrow run file (its schema and writer are in :mod:`inspector.runfiles`, below the
watch and ``check_step`` both) that :func:`read_run` reads, also while it grows; findings
(``nonfinite-forward``, ``dead-gradient``, ...) name the module and the step.

Modules: ``captured``: the inputs and outputs of the module that first produced a NaN/Inf; ``checked``: a
``check_step`` run as a :class:`Run`; ``core``:
``watch``, the context manager around a training loop; ``detect``: findings from one step's numbers on
the host; ``layout``: which tensors a watch follows; ``numbers``: one rank's numbers at one step;
``steps``: the per-step work of a watch; ``summary``: run files reduced for display; ``synthetic``: a
synthetic run file of any size; ``tracer``: non-finite forward and backward tracing without a host sync
per module; ``run``: reading a run file back; ``train``: a short training loop under :func:`watch`;
``checks``: the loop checks (gradient clearing, training mode, optimizers stepped, progress, failures);
``rows``: one step's record; ``ranks``: the ranks' meeting at each step, their failures, slow ranks.
"""

from __future__ import annotations

from ..runfiles import META_KEY, RunMeta, RunWriter, StepRecord, record_batch, schema
from ..runfiles.columns import FORMAT, VERSION
from .captured import captures_path, load_captures, producer_of, read_captures, save_captures
from .core import Watch, WatchResult, watch
from .run import (
    MODULE_COLUMNS,
    STEP_COLUMNS,
    Run,
    StepFinding,
    finding_line,
    is_watch_file,
    parse_run_bytes,
    read_run,
)
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
    "finding_line",
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
