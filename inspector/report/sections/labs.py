"""The labs section: a student's lab results (as data from :func:`inspector.labs.lab_results`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ...labs import get_lab, lab_results
from ...utils.findings import Finding
from ..data import Section, Table
from ..options import SECTION_TITLES, how_to
from .context import Context, SectionUnavailable


def labs_section(ctx: Context) -> Section:
    lab = ctx.options["lab"]
    if lab is None:
        raise SectionUnavailable(f"no lab results: {how_to(ctx.options, 'lab')}")
    if isinstance(lab, str):
        lab = get_lab(lab)
    return lab_section(lab_results(lab, ctx.options["lab_progress"] or {}, ctx.options["student"] or ""))


def lab_section(results: Mapping[str, Any]) -> Section:
    """The ``labs`` section of a report from one lab's results (what ``lab_results`` returns).

    >>> from inspector.labs import get_lab, lab_results
    >>> lab_section(lab_results(get_lab("broken-tie"), {}, "Ada")).facts["passed"]
    0
    """
    rows = tuple((t["id"], t["prompt"], "passed" if t["passed"] else "not passed" if t["attempts"]
                  else "not tried", t["attempts"],
                  "; ".join(f"{k} = {v if isinstance(v, str) else json.dumps(v)}"
                            for k, v in t["answers"].items()),
                  t["message"], "; ".join(t["evidence"])) for t in results["tasks"])
    lab_id, title, student = results["lab"], results["title"], results["student"]
    table = Table(f"{title}: tasks", ("task", "question", "result", "attempts", "answers",
                                      "feedback", "what the inspector measured"), rows)
    open_tasks = tuple(Finding("lab-task-open", "info", t["id"],
                               f"lab {lab_id}: task {t['id']} is not passed yet")
                       for t in results["tasks"] if not t["passed"])
    return Section(
        "labs",
        SECTION_TITLES["labs"],
        note=f"Lab {title!r}" + (f", student {student}" if student else ""),
        facts={
            "lab": lab_id,
            "title": title,
            "student": student,
            "tasks": len(results["tasks"]),
            "passed": results["passed"],
        },
        tables=(table,),
        findings=open_tasks,
    )
