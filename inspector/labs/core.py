"""The pieces a lab is made of: fields, tasks, views, the scenario, and grading."""

from __future__ import annotations

import hmac
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from ..loading.models import LoadedModel
from ..utils.findings import InspectorError

FieldKind = Literal["text", "number", "choice", "multi", "json", "pairs"]
TEACHER_KEY_ENV = "INSPECTOR_TEACHER_KEY"


@dataclass(frozen=True)
class Scenario:
    """What a student works on: a model in its broken state, plus whatever the lab keeps beside it.

    ``loaded`` wraps the broken model (so every view and the report can use it like any model);
    ``extras`` holds the lab's own objects, e.g. the tie snapshot taken before a conversion.
    """

    loaded: LoadedModel
    extras: Mapping[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> nn.Module:
        return self.loaded.model


@dataclass(frozen=True)
class Field:
    """One answer field.

    Args:
        key: the key of the answer in the answers dict.
        label: what the student reads next to the field.
        kind: ``"text"``, ``"number"`` (a whole number), ``"choice"`` (one of ``options``),
            ``"multi"`` (several of ``options``), ``"json"`` (a JSON object typed in a text area)
            or ``"pairs"`` (lines of ``a -> b``).
        options: fixed options, or a function of the scenario that lists them.
        help: a tooltip.
        placeholder: grey example text for text fields.
        default: the starting value (for ``"json"``: a function of the scenario may give it).
    """

    key: str
    label: str
    kind: FieldKind = "text"
    options: tuple[str, ...] | Callable[[Scenario], list[str]] = ()
    help: str = ""
    placeholder: str = ""
    default: Any = None

    def options_for(self, scenario: Scenario) -> list[str]:
        return list(self.options(scenario) if callable(self.options) else self.options)

    def default_for(self, scenario: Scenario) -> Any:
        return self.default(scenario) if callable(self.default) else self.default

    def parse(self, raw: Any) -> Any:
        """The typed value of ``raw``; raises InspectorError naming the field when it cannot."""
        if self.kind == "number":
            if isinstance(raw, bool):
                raise InspectorError(f"{self.label}: give a whole number")
            if isinstance(raw, int):
                return raw
            if isinstance(raw, float) and raw.is_integer():
                return int(raw)
            text = str(raw if raw is not None else "").strip().replace(",", "").replace("_", "")
            if not re.fullmatch(r"[+-]?\d+", text):
                raise InspectorError(f"{self.label}: give a whole number, not {str(raw)!r}")
            return int(text)
        if self.kind == "multi":
            if raw is None:
                return []
            if isinstance(raw, str):
                return [p.strip() for p in re.split(r"[,\n]", raw) if p.strip()]
            return [str(v) for v in raw]
        if self.kind == "json":
            if isinstance(raw, Mapping):
                return dict(raw)
            try:
                value = json.loads(str(raw or ""))
            except json.JSONDecodeError as exc:
                raise InspectorError(f"{self.label}: not valid JSON ({exc.msg} at line {exc.lineno}, "
                                     f"column {exc.colno})") from None
            if not isinstance(value, dict):
                raise InspectorError(f"{self.label}: give a JSON object {{\"name\": device, ...}}, "
                                     f"not a {type(value).__name__}")
            return value
        if self.kind == "pairs":
            return parse_pairs(raw, self.label)
        return "" if raw is None else str(raw).strip()


def parse_pairs(raw: Any, label: str = "pairs") -> dict[str, str]:
    """``"a -> b; c -> d"`` (or one pair a line, ``:`` or ``=>`` as arrows) as ``{a: b, c: d}``.

    >>> parse_pairs("conv1 -> relu1\\nbn2 -> relu2")
    {'conv1': 'relu1', 'bn2': 'relu2'}
    """
    if isinstance(raw, Mapping):
        return {str(k).strip(): str(v).strip() for k, v in raw.items()}
    out: dict[str, str] = {}
    for part in re.split(r"[;\n]", str(raw or "")):
        part = part.strip().strip(",")
        if not part:
            continue
        bits = re.split(r"\s*(?:->|=>|→|:)\s*", part, maxsplit=1)
        if len(bits) != 2 or not bits[0] or not bits[1]:
            raise InspectorError(f"{label}: write each pair as 'captured -> overwriter', got {part!r}")
        out[bits[0].strip()] = bits[1].strip()
    return out


@dataclass(frozen=True)
class CheckResult:
    """What a checker decided: passed or not, a sentence for the student, and the evidence.

    ``evidence`` lists what the inspector's analyses said (counts, finding codes...), so the
    student sees why, and the lab report records it.
    """

    passed: bool
    message: str
    evidence: tuple[str, ...] = ()
    counted: bool = True  # False: the answer was incomplete or unreadable; no attempt, no hint


Checker = Callable[[Scenario, Mapping[str, Any]], CheckResult]


@dataclass(frozen=True)
class Task:
    """One question of a lab.

    Args:
        id: short identifier, unique within the lab.
        prompt: markdown: what to find out.
        fields: the answer fields.
        check: ``check(scenario, answers) -> CheckResult``; ``answers`` are already parsed.
        hints: shown one more after each failed check.
        solution: answers that pass (or a function of the scenario giving them), for teachers.
        explanation: markdown a teacher can reveal with the solution.
    """

    id: str
    prompt: str
    fields: tuple[Field, ...]
    check: Checker
    hints: tuple[str, ...] = ()
    solution: Mapping[str, Any] | Callable[[Scenario], Mapping[str, Any]] = field(default_factory=dict)
    explanation: str = ""

    def solution_for(self, scenario: Scenario) -> dict[str, Any]:
        return dict(self.solution(scenario) if callable(self.solution) else self.solution)


@dataclass(frozen=True)
class View:
    """Something the lab page shows: ``build(scenario)`` returns a DataFrame, a plotly Figure,
    markdown text, or a list of those. ``on_demand`` views run only when the student presses
    their button (experiments)."""

    title: str
    build: Callable[[Scenario], Any]
    caption: str = ""
    on_demand: bool = False
    after: str = ""  # a task id: the view names that task's answer, so it shows once the task is passed


@dataclass(frozen=True)
class Lab:
    """A debugging lab: a story, a model with a silent bug, tasks graded by the inspector's analyses.

    Args:
        id: short identifier (letters, digits, ``-`` and ``_``), unique among all labs.
        title: one line.
        story: markdown: what the student sees going wrong.
        build: returns a fresh :class:`Scenario` (the model and the step that broke it).
        tasks: the questions, in order.
        views: what the page shows beside the story.
        solution: markdown for teachers: the whole fix, explained.
        source: where the lab came from (filled in by discovery).
    """

    id: str
    title: str
    story: str
    build: Callable[[], Scenario]
    tasks: tuple[Task, ...]
    views: tuple[View, ...] = ()
    solution: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]+", self.id or ""):
            raise InspectorError(f"lab id {self.id!r} must be letters, digits, '-' or '_'")
        if not self.tasks:
            raise InspectorError(f"lab {self.id!r} has no tasks")
        ids = [t.id for t in self.tasks]
        if len(set(ids)) != len(ids):
            raise InspectorError(f"lab {self.id!r} has two tasks with one id: {ids}")

    def task(self, task_id: str) -> Task:
        for t in self.tasks:
            if t.id == task_id:
                return t
        raise InspectorError(f"lab {self.id!r} has no task {task_id!r}; its tasks: "
                             f"{', '.join(t.id for t in self.tasks)}")


def watch_findings(scenario: Scenario) -> Any:
    """The findings of the watched run a scenario holds (``extras["run"]``), each at the step it first
    appeared (a DataFrame): the view of the labs built on a watch."""
    import pandas as pd

    rows = [{"step": f.step, "code": f.code, "where": f.where, "message": f.message}
            for f in scenario.extras["run"].findings]
    return pd.DataFrame(rows, columns=["step", "code", "where", "message"])


def grade(lab: Lab, task_id: str, scenario: Scenario, raw_answers: Mapping[str, Any]) -> CheckResult:
    """Parse the answers of one task and run its checker.

    A field left empty or that cannot be parsed gives a failed result that is not counted
    (``counted=False``: no attempt, no hint); a checker that raises an InspectorError gives a
    failed, counted result with the reason. Never an exception.
    """
    task = lab.task(task_id)
    missing = missing_fields(task, raw_answers)
    if missing:
        return CheckResult(False, f"Answer every field first: {', '.join(missing)}.", counted=False)
    answers: dict[str, Any] = {}
    try:
        for f in task.fields:
            answers[f.key] = f.parse(raw_answers.get(f.key))
    except InspectorError as exc:
        return CheckResult(False, str(exc), counted=False)
    try:
        return task.check(scenario, answers)
    except InspectorError as exc:
        return CheckResult(False, str(exc))


def is_blank(value: Any) -> bool:
    """Whether an answer field was left empty: None, blank text or an empty list or mapping.

    >>> is_blank("  "), is_blank([]), is_blank(0), is_blank("x")
    (True, True, False, False)
    """
    return value is None or (isinstance(value, str) and not value.strip()) or (
        isinstance(value, (list, tuple, dict)) and not value)


def missing_fields(task: Task, raw_answers: Mapping[str, Any]) -> list[str]:
    """The labels of the task's fields left empty in ``raw_answers``."""
    return [f.label for f in task.fields if is_blank(raw_answers.get(f.key))]


@dataclass
class TaskRecord:
    """A student's progress on one task: the last answer checked, and the one that passed.

    ``answers``, ``message``, ``evidence`` and ``when`` are the last check's; the ``passed_*``
    fields keep the first passing check's, whatever came after it. Times are UTC,
    ``YYYY-MM-DD HH:MM:SS``; ``started`` is the first check's.
    """

    answers: dict[str, Any] = field(default_factory=dict)
    attempts: int = 0
    passed: bool = False
    last_passed: bool = False
    message: str = ""
    evidence: tuple[str, ...] = ()
    when: str = ""
    started: str = ""
    passed_answers: dict[str, Any] = field(default_factory=dict)
    passed_message: str = ""
    passed_evidence: tuple[str, ...] = ()
    passed_when: str = ""
    passed_attempts: int = 0


def now() -> str:
    """The time now, UTC, as a lab record writes it."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())


def record_attempt(progress: dict[str, dict[str, TaskRecord]], lab_id: str, task_id: str,
                   answers: Mapping[str, Any], result: CheckResult) -> TaskRecord | None:
    """Store one check in ``progress`` (a plain dict kept by the page), in place.

    A result that is not counted (an incomplete answer) changes nothing and gives None. Once a
    task has passed, a later wrong try is still counted but does not undo the pass, and the
    passing answer stays in the record.
    """
    if not result.counted:
        return None
    rec = progress.setdefault(lab_id, {}).setdefault(task_id, TaskRecord())
    rec.attempts += 1
    rec.answers = {k: _plain(v) for k, v in answers.items()}
    rec.last_passed = result.passed
    rec.message = result.message
    rec.evidence = tuple(result.evidence)
    rec.when = now()
    rec.started = rec.started or rec.when
    if result.passed and not rec.passed:
        rec.passed = True
        rec.passed_answers = dict(rec.answers)
        rec.passed_message, rec.passed_evidence = rec.message, rec.evidence
        rec.passed_when, rec.passed_attempts = rec.when, rec.attempts
    return rec


def hints_to_show(task: Task, record: TaskRecord | None) -> tuple[str, ...]:
    """One more hint after each failed (counted) check; none before the first try or after a pass."""
    if record is None or record.passed:
        return ()
    return task.hints[:record.attempts]


def lab_done(lab: Lab, progress: Mapping[str, Mapping[str, TaskRecord]]) -> int:
    """How many of the lab's tasks have passed."""
    recs = progress.get(lab.id, {})
    return sum(1 for t in lab.tasks if recs.get(t.id) is not None and recs[t.id].passed)


def teacher_unlocked(entered: str | None, environ: Mapping[str, str] | None = None) -> bool:
    """True when INSPECTOR_TEACHER_KEY is set (not empty) and ``entered`` equals it.

    >>> teacher_unlocked("s3cret", {"INSPECTOR_TEACHER_KEY": "s3cret"})
    True
    >>> teacher_unlocked("s3cret", {})
    False
    """
    key = (os.environ if environ is None else environ).get(TEACHER_KEY_ENV, "")
    if not key or not entered:
        return False
    return hmac.compare_digest(key.encode(), str(entered).encode())


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)
