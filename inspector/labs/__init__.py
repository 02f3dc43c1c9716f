"""Classroom labs: a model with a real, silent bug, found with the inspector's views and graded
by the inspector's own analyses.

A lab is a :class:`Lab` (story, scenario builder, tasks with answer fields and a checker each,
hints, solution). The package ships nine; a teacher adds one by dropping a Python file that
defines ``LAB = Lab(...)`` into the folder named by ``INSPECTOR_LABS_DIR``.

>>> [lab.id for lab in discover_labs(labs_dir="")]  # doctest: +NORMALIZE_WHITESPACE
['broken-tie', 'shifted-offsets', 'stranded-buffer', 'corrupted-capture', 'flattening-myths',
 'find-the-op', 'late-overflow', 'silent-block', 'stalled-schedule']

Modules: ``broken_tie``: lab: the broken tie; ``core``: the pieces a lab is made of;
``corrupted_capture``: lab: the corrupted capture; ``find_the_op``: lab: find the op (a replayed
step); ``discovery``: finding labs: the ones shipped in this
package and the ones a teacher adds; ``flattening_myths``: lab: myths of flattening; ``late_overflow``: lab:
the late overflow; ``records``: a student's lab results as plain data, as a Markdown lab report and as
a signed results file;
``shifted_offsets``: lab: the shifted offsets; ``silent_block``: lab: the silent block;
``stalled_schedule``: lab: the stalled schedule (a watched run); ``stranded_buffer``: lab: the stranded
buffer.
"""

from __future__ import annotations

from ..utils.findings import InspectorError
from .core import (
    TEACHER_KEY_ENV,
    CheckResult,
    Field,
    Lab,
    Scenario,
    Task,
    TaskRecord,
    View,
    grade,
    hints_to_show,
    is_blank,
    lab_done,
    missing_fields,
    parse_pairs,
    record_attempt,
    teacher_unlocked,
)
from .discovery import LABS_DIR_ENV, LabError, discover_labs, load_lab_file
from .records import Verified, class_rows, lab_report_markdown, lab_results, read_results, results_document


def get_lab(lab_id: str, labs_dir: str | None = None) -> Lab:
    """The lab called ``lab_id`` (package labs and ``INSPECTOR_LABS_DIR``)."""
    entries = discover_labs(labs_dir)
    for e in entries:
        if isinstance(e, Lab) and e.id == lab_id:
            return e
    for e in entries:
        if isinstance(e, LabError) and e.id == lab_id:
            raise InspectorError(e.message)
    raise InspectorError(f"no lab {lab_id!r}; labs: "
                         f"{', '.join(e.id for e in entries if isinstance(e, Lab))}")


__all__ = ["Lab", "Task", "Field", "View", "Scenario", "CheckResult", "TaskRecord", "LabError",
           "discover_labs", "load_lab_file", "get_lab", "grade", "record_attempt", "hints_to_show",
           "lab_done", "teacher_unlocked", "parse_pairs", "lab_results", "lab_report_markdown",
           "results_document", "read_results", "class_rows", "Verified", "is_blank", "missing_fields",
           "LABS_DIR_ENV", "TEACHER_KEY_ENV"]
