"""The run file, written by the watch and by ``check_step`` and read back, below both.

- :mod:`.columns`: the Arrow run file's columns, defined once: :class:`RunMeta` (what the file says
  about itself), :class:`StepRecord` (one row: a rank's numbers at a step), :func:`schema`,
  :func:`record_batch`; versioned (``FORMAT`` ``inspector-watch``);
- :mod:`.stream`: the file as an Arrow IPC stream: :func:`read_stream`, the one reader of its
  messages (the schema and its :class:`RunMeta`, every whole batch, a last batch cut short left
  out), used by ``inspector.read_run``, :func:`read_check_run` and the tracker exports following a
  growing run; :class:`RunWriter` (the watch's writer) and :func:`append_check` (``check_step``'s);
- :mod:`.guard`: what a run file may hold, checked before any of it is used (it is untrusted input):
  only regular files opened, the schema the project writes, each batch's header before Arrow reads
  it, every batch validated in full, and the limits (modules, rows, lrs, scalar names, metadata);
- :mod:`.tail`: :func:`~.tail.scan`, the checked reader of the stream's messages, and
  :class:`~.tail.RunTail`, a file (or an upload's bytes) read in blocks from where it stopped, its
  steps kept in a few large record batches (memory for the numbers, not per step);
- :mod:`.alike`: steps whose batch headers repeat byte for byte (a healthy run's, one batch per step)
  read as one batch, a strided copy per buffer, so a fast writer is not outrun by a message per step;
- :mod:`.frames`: the steps table and the findings of the steps read, built column-wise in one step;
- :mod:`.record`: :class:`CheckRecord` and its parts, built from every rank's numbers (format
  ``inspector-distributed``, versioned), and its Arrow type (:func:`~.record.check_type`): the
  ``check`` column of the run file, where ``check_step`` appends one row per step; older versions
  wrote one JSON line per step;
- :mod:`.run`: :func:`read_check_run` reads either back (:func:`parse_check_stream` /
  :func:`parse_run` from bytes or text; :func:`check_run_of` from a stream already read) as a
  :class:`DistributedRun` (tables of steps, ranks and tensors), which ``inspector.read_run`` (the one
  reader of run files) keeps as ``Run.check_run``, and the findings a run holds;
- :mod:`.jsonlines`: the JSON lines older versions wrote, read one line at a time (:func:`parse_lines`),
  each line's density checked before it is parsed; a file holds at most ``MAX_JSONL_BYTES`` bytes and
  ``MAX_JSONL_RECORDS`` lines, both known before its first line is parsed.
- :mod:`.tables`: :class:`Run`, a run file of either kind as tables (steps, modules, parameters,
  findings as :class:`StepFinding`), and :func:`finding_line`;
- :mod:`.checked`: a ``check_step`` run (:class:`DistributedRun`) as a :class:`Run` of kind ``"check"``;
- :mod:`.reading`: :func:`read_run`, the one reader of every run file (``inspector.read_run``,
  ``inspector.watching.read_run`` and ``inspector.distributed.read_run`` are this function), and
  :func:`parse_run_bytes` (an upload); :func:`is_watch_file`;
- :mod:`.captured`: the inputs and outputs of the first NaN/Inf producer, stored next to the run file
  (:func:`~.captured.read_captures`, also ``Run.captures``).

It needs no process group: the report, the Training page and ``compare`` read run files here,
above the analyses and below :mod:`inspector.watching` and :mod:`inspector.distributed`, which write
them and hand its names on; it imports neither.
"""

from __future__ import annotations

from .columns import RunMeta, StepRecord, record_batch, schema
from .jsonlines import MAX_JSONL_BYTES, MAX_JSONL_RECORDS
from .reading import is_watch_file, parse_run_bytes, read_run
from .record import CheckRecord, RankNumbers, StepTotals, TensorRow
from .run import (
    DistributedRun,
    check_run_of,
    is_run_file,
    parse_check_stream,
    parse_run,
    rank_issues,
    read_check_run,
    records_of,
    unique_findings,
    unsynchronised,
)
from .stream import END_OF_STREAM, META_KEY, STREAM_MAGIC, RunStream, RunWriter, append_check, read_stream
from .tables import MODULE_COLUMNS, STEP_COLUMNS, Run, StepFinding, finding_line

__all__ = ["END_OF_STREAM", "MAX_JSONL_BYTES", "MAX_JSONL_RECORDS", "META_KEY", "STREAM_MAGIC",
           "CheckRecord", "DistributedRun", "RankNumbers", "RunMeta", "RunStream", "RunWriter",
           "StepRecord", "StepTotals", "TensorRow", "append_check", "check_run_of", "is_run_file",
           "parse_check_stream", "parse_run", "rank_issues", "read_check_run", "read_stream",
           "record_batch", "records_of", "schema", "unique_findings", "unsynchronised", "MODULE_COLUMNS",
           "STEP_COLUMNS", "Run", "StepFinding", "finding_line", "is_watch_file", "parse_run_bytes",
           "read_run"]
