"""A student's lab results as plain data and as a Markdown lab report."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from ..escaping import markdown_text
from .core import Lab, TaskRecord


def lab_results(lab: Lab, progress: Mapping[str, Mapping[str, TaskRecord]],
                student: str = "") -> dict[str, Any]:
    """One lab's results as JSON-ready data: per task the answers, attempts, pass and evidence.

    >>> from inspector.labs import get_lab
    >>> lab_results(get_lab("broken-tie"), {})["passed"]
    0
    """
    recs = progress.get(lab.id, {})
    tasks = []
    for t in lab.tasks:
        rec = recs.get(t.id)
        tasks.append({"id": t.id, "prompt": t.prompt, "answers": dict(rec.answers) if rec else {},
                      "attempts": rec.attempts if rec else 0, "passed": bool(rec and rec.passed),
                      "message": rec.message if rec else "", "evidence": list(rec.evidence) if rec else [],
                      "when": rec.when if rec else ""})
    return {"lab": lab.id, "title": lab.title, "student": student,
            "passed": sum(t["passed"] for t in tasks), "tasks": tasks}


def lab_report_markdown(lab: Lab, progress: Mapping[str, Mapping[str, TaskRecord]],
                        student: str = "") -> str:
    """A Markdown lab report: the story, then each task with the answers given and the result."""
    res = lab_results(lab, progress, student)
    lines = [f"# Lab report: {_md(lab.title)}", ""]
    if student:
        lines += [f"Student: {_md(student)}", ""]
    lines += [f"Generated {time.strftime('%Y-%m-%d %H:%M:%S')}. "
              f"Tasks passed: **{res['passed']} of {len(res['tasks'])}**.", "",
              "## The story", "", lab.story.strip(), ""]
    for i, t in enumerate(res["tasks"], 1):
        status = "passed" if t["passed"] else ("not passed" if t["attempts"] else "not tried")
        lines += [f"## Task {i}: {status}", "", t["prompt"], "",
                  f"Attempts: {t['attempts']}" + (f" (last at {t['when']})" if t["when"] else ""), ""]
        if t["answers"]:
            lines += ["| field | answer |", "|---|---|"]
            for key, value in t["answers"].items():
                text = value if isinstance(value, str) else json.dumps(value)
                lines.append(f"| {_md(key)} | {_md(text)} |")
            lines.append("")
        if t["message"]:
            lines += [f"Feedback: {t['message']}", ""]
        if t["evidence"]:
            lines += ["What the inspector measured:", ""] + [f"- {_md(e)}" for e in t["evidence"]] + [""]
    return "\n".join(lines)


def _md(text: Any) -> str:
    """Text safe for Markdown (a table cell too): no link, image, markup or table break."""
    return markdown_text(text)


def lab_section(lab: Lab, progress: Mapping[str, Mapping[str, TaskRecord]], student: str = ""):
    """The lab's results as a ``labs`` section of :mod:`inspector.report`."""
    from ..findings import Finding
    from ..report import SECTION_TITLES, Section, Table

    res = lab_results(lab, progress, student)
    rows = tuple((t["id"], t["prompt"], "passed" if t["passed"] else "not passed" if t["attempts"]
                  else "not tried", t["attempts"],
                  "; ".join(f"{k} = {v if isinstance(v, str) else json.dumps(v)}"
                            for k, v in t["answers"].items()),
                  t["message"], "; ".join(t["evidence"])) for t in res["tasks"])
    table = Table(f"{lab.title}: tasks", ("task", "question", "result", "attempts", "answers",
                                          "feedback", "what the inspector measured"), rows)
    open_tasks = tuple(Finding("lab-task-open", "info", t["id"],
                               f"lab {lab.id}: task {t['id']} is not passed yet")
                       for t in res["tasks"] if not t["passed"])
    section = Section("labs", SECTION_TITLES["labs"], note=f"Lab {lab.title!r}"
                      + (f", student {student}" if student else ""),
                      facts={"lab": lab.id, "title": lab.title, "student": student,
                             "tasks": len(res["tasks"]), "passed": res["passed"]},
                      tables=(table,), findings=open_tasks)
    return section


def lab_report(lab: Lab, progress: Mapping[str, Mapping[str, TaskRecord]], loaded: Any,
               student: str = ""):
    """A :class:`inspector.report.Report` of the lab's model (summary) with the lab results.

    Render it with ``.to_markdown()``, ``.to_html()`` or ``.to_json()``.
    """
    from dataclasses import replace

    from ..report import build_report

    report = build_report(loaded, ["summary"])
    return replace(report, sections=(*report.sections, lab_section(lab, progress, student)))
