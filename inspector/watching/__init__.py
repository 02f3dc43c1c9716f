"""Watch a training run step by step: ``with watch(model, optimizer, "run.inspect") as w: ...``.

Every step records per-module gradient and parameter norms, learning rates, step time and
memory into an Arrow run file (its schema, its writer and its reader :func:`read_run`, with
:class:`Run`, are in :mod:`inspector.runfiles`, below the watch and ``check_step`` both; this package
hands them on) that :func:`read_run` reads, also while it grows; findings (``nonfinite-forward``,
``dead-gradient``, ...) name the module and the step.

Modules: ``table``: the watch's rules in one ordered table (:data:`~.table.WATCH_CHECKS`: which check
runs at which event, in which order, with which codes); ``rules``: the checks themselves, one small class
each with one interface; ``events``: what a check reads at one event (``At``) and what it is built from;
``roles``: the parts a :class:`Watch` is made of (options, target, ranks, recorder, stop control);
``checks``: the state behind the checks that follow the loop (eval mode, frozen and replaced
parameters, optimizers that do not step, nothing updating, a failed run); ``clearing``: whether the
gradients a step used were cleared before a backward added onto them; ``rows``: one step's
numbers as the run file's row; ``core``: :class:`Watch`, the hooks and the per-step work around a
training loop; ``prestep``: what comes before the optimizer's step (its pre-step hook, the ranks' check-ins,
the clip); ``outside``: what is recorded outside a step (a signal that ends the process, a step the scaler
skipped); ``block``: ``watch``, the context manager that opens and closes it; ``result``: its frozen
result; ``detect``: findings from one step's numbers on the host (:class:`Detectors`, which can replay a
run); ``layout``: which tensors a watch follows; ``flags``: the tracer's (low, high) buffers on the
device; ``live``: a growing run file followed, reading only what was appended; ``numbers``: one rank's
numbers at one step; ``producer``: a copy of the inputs and outputs of the module that first produced a
NaN/Inf (``inspector.runfiles.captured`` stores and reads it); ``steps``: the per-step work of a watch;
``stepfindings``: the NaN/Inf and written-weight findings read from one step's numbers;
``ranks``: the ranks' meeting at each step, their failures; ``processes``: whether a rank's process still
runs; ``gather``: a step's numbers and findings gathered across the ranks; ``clock``: each rank's time
before the step's first collective, slow ranks; ``summary``: run files reduced
for display; ``synthetic``: a synthetic run file of any size; ``tracer``: non-finite forward and backward
tracing without a host sync per module; ``train``: a short training loop under :func:`watch`.
"""

from __future__ import annotations

from ..runfiles import (
    META_KEY,
    MODULE_COLUMNS,
    STEP_COLUMNS,
    Run,
    RunMeta,
    RunWriter,
    StepFinding,
    StepRecord,
    finding_line,
    is_watch_file,
    parse_run_bytes,
    read_run,
    record_batch,
    schema,
)
from ..runfiles.captured import captures_path, load_captures, producer_of, read_captures, save_captures
from ..runfiles.columns import FORMAT, VERSION
from .block import watch
from .core import Watch
from .detect import NOISE, WARM_UP, Detectors
from .layout import Layout
from .live import LiveRun
from .result import WatchResult
from .summary import (
    Verdict,
    finding_counts,
    first_findings,
    first_producer,
    main_steps,
    ordered_findings,
    verdict,
)
from .synthetic import synthetic_run
from .table import WATCH_CHECKS, Row, table_markdown
from .train import OPTIMIZERS, make_optimizer, train_watched

__all__ = [
    "FORMAT",
    "VERSION",
    "LiveRun",
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
    "LiveRun",
    "Detectors",
    "Layout",
    "NOISE",
    "WARM_UP",
    "Watch",
    "WatchResult",
    "watch",
    "finding_counts",
    "first_findings",
    "ordered_findings",
    "first_producer",
    "verdict",
    "Verdict",
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
    "WATCH_CHECKS",
    "Row",
    "table_markdown",
]
