"""A student's lab results as plain data and as a Markdown lab report."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from ..utils.escaping import markdown_text
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
