"""A student's lab results: as plain data, as a Markdown lab report, and as a signed results file.

The results file (``lab-results.json``) holds every task record of a student, a checksum over
them, and nothing else: the page writes it, reads it back to continue where the student left
off, and ``python -m inspector labs collect`` turns a class's files into one table. The checksum
is an HMAC-SHA256 keyed with ``INSPECTOR_TEACHER_KEY`` when the server has that key (a student
cannot recompute it), else a plain SHA-256 (it shows an edit, but not one whose author also
recomputed the sum).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from ..utils.escaping import markdown_text
from ..utils.findings import InspectorError
from .core import TEACHER_KEY_ENV, Lab, TaskRecord

RESULTS_FORMAT = "inspector-lab-results"
RESULTS_VERSION = 1
_EMBED = re.compile(r"<!-- inspector-lab-results\n(.*?)\n-->", re.S)
_RECORD_FIELDS = {f.name for f in fields(TaskRecord)}


def lab_results(lab: Lab, progress: Mapping[str, Mapping[str, TaskRecord]],
                student: str = "") -> dict[str, Any]:
    """One lab's results as JSON-ready data: per task the answers, attempts, pass and evidence.

    A passed task shows the answer that passed (and its feedback), whatever was tried after it;
    ``later`` counts the checks after the pass.

    >>> from inspector.labs import get_lab
    >>> lab_results(get_lab("broken-tie"), {})["passed"]
    0
    """
    recs = progress.get(lab.id, {})
    tasks = []
    for t in lab.tasks:
        rec = recs.get(t.id) or TaskRecord()
        won = rec.passed and bool(rec.passed_when)
        tasks.append({"id": t.id, "prompt": t.prompt,
                      "answers": dict(rec.passed_answers if won else rec.answers),
                      "attempts": rec.attempts, "passed": rec.passed,
                      "message": rec.passed_message if won else rec.message,
                      "evidence": list(rec.passed_evidence if won else rec.evidence),
                      "when": rec.passed_when if won else rec.when,
                      "later": rec.attempts - rec.passed_attempts if won else 0})
    return {"lab": lab.id, "title": lab.title, "student": student,
            "passed": sum(t["passed"] for t in tasks), "tasks": tasks}


def lab_report_markdown(lab: Lab, progress: Mapping[str, Mapping[str, TaskRecord]],
                        student: str = "", environ: Mapping[str, str] | None = None) -> str:
    """A Markdown lab report: the story, then each task with the answers given and the result.

    The report ends with this lab's signed results (an HTML comment, invisible when rendered), so
    ``labs collect`` reads a Markdown report as it reads a results file.
    """
    res = lab_results(lab, progress, student)
    lines = [f"# Lab report: {_md(lab.title)}", ""]
    if student:
        lines += [f"Student: {_md(student)}", ""]
    lines += [f"Generated {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC. "
              f"Tasks passed: **{res['passed']} of {len(res['tasks'])}**.", "",
              "## The story", "", lab.story.strip(), ""]
    for i, t in enumerate(res["tasks"], 1):
        status = "passed" if t["passed"] else ("not passed" if t["attempts"] else "not tried")
        at = "" if not t["when"] else f" ({'passed' if t['passed'] else 'last'} at {t['when']} UTC)"
        lines += [f"## Task {i}: {status}", "", t["prompt"], "", f"Attempts: {t['attempts']}{at}", ""]
        if t["answers"]:
            lines += ["| field | " + ("passing answer" if t["passed"] else "last answer") + " |", "|---|---|"]
            for key, value in t["answers"].items():
                text = value if isinstance(value, str) else json.dumps(value)
                lines.append(f"| {_md(key)} | {_md(text)} |")
            lines.append("")
        if t["message"]:
            lines += [f"Feedback: {t['message']}", ""]
        if t["later"]:
            lines += [f"{t['later']} later check(s) after the pass; they do not change it.", ""]
        if t["evidence"]:
            lines += ["What the inspector measured:", ""] + [f"- {_md(e)}" for e in t["evidence"]] + [""]
    doc = results_document([lab], progress, student, environ)
    lines += ["<!-- inspector-lab-results", json.dumps(doc, indent=1).replace("--", "\\u002d-"), "-->", ""]
    return "\n".join(lines)


def results_document(labs: Iterable[Lab], progress: Mapping[str, Mapping[str, TaskRecord]],
                     student: str = "", environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The signed results of ``labs`` (those with at least one check) as a JSON-ready dict.

    >>> from inspector.labs import get_lab
    >>> doc = results_document([get_lab("broken-tie")], {}, "Ada", environ={})
    >>> doc["format"], doc["labs"], doc["checksum"]["method"]
    ('inspector-lab-results', {}, 'sha256')
    """
    body: dict[str, Any] = {"format": RESULTS_FORMAT, "version": RESULTS_VERSION, "student": str(student),
                            "written": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "labs": {}}
    for lab in labs:
        recs = progress.get(lab.id, {})
        tasks = {t.id: _record_data(recs[t.id]) for t in lab.tasks if t.id in recs}
        if tasks:
            body["labs"][lab.id] = {"title": lab.title, "tasks": tasks}
    body["checksum"] = _checksum(body, _key(environ))
    return body


@dataclass(frozen=True)
class Verified:
    """A results document read back: who, what, and whether its checksum held.

    ``status`` is ``"signed"`` (HMAC with the teacher key: good), ``"checksum"`` (plain SHA-256 that
    matches: an edit whose author recomputed it would not show), ``"tampered"`` (the checksum does not
    match: changed after it was written) or ``"unverifiable"`` (signed with a teacher key that is not
    given here).
    """

    student: str
    labs: Mapping[str, Mapping[str, Any]]
    status: str
    written: str

    @property
    def trusted(self) -> bool:
        return self.status in ("signed", "checksum")

    def progress(self) -> dict[str, dict[str, TaskRecord]]:
        """The task records, as the page keeps them."""
        return {lab_id: {task_id: _record(data) for task_id, data in lab["tasks"].items()}
                for lab_id, lab in self.labs.items()}


def read_results(text: str | bytes, name: str = "results file",
                 environ: Mapping[str, str] | None = None) -> Verified:
    """Read a results file (or a Markdown lab report holding one) and check its checksum.

    Raises:
        InspectorError: ``name`` is not a results file or a lab report (the message says which).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise InspectorError(f"{name} is not text: give the lab-results .json or the lab report .md "
                                 "the Labs page wrote") from None
    embedded = _EMBED.search(text)
    raw = embedded.group(1) if embedded else text  # json.loads reads the escaped dashes back
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError:
        raise InspectorError(f"{name} holds no lab results: give the lab-results .json or the lab report .md "
                             "the Labs page wrote") from None
    if not isinstance(doc, dict) or doc.get("format") != RESULTS_FORMAT:
        raise InspectorError(f"{name} is not a lab results file (no format {RESULTS_FORMAT!r})")
    if doc.get("version") != RESULTS_VERSION:
        raise InspectorError(f"{name} is lab results version {doc.get('version')!r}; this inspector reads "
                             f"version {RESULTS_VERSION}")
    labs = doc.get("labs")
    checksum = doc.get("checksum")
    if not isinstance(labs, dict) or not isinstance(checksum, dict) or not all(
            isinstance(v, dict) and isinstance(v.get("tasks"), dict)
            and all(isinstance(t, dict) for t in v["tasks"].values()) for v in labs.values()):
        raise InspectorError(f"{name} is a damaged lab results file (its labs or checksum are missing)")
    body = {k: v for k, v in doc.items() if k != "checksum"}
    method, key = checksum.get("method"), _key(environ)
    if method == "hmac-sha256" and not key:
        status = "unverifiable"
    elif method in ("hmac-sha256", "sha256"):
        expected = _checksum(body, key if method == "hmac-sha256" else "")
        status = ("tampered" if not hmac.compare_digest(str(checksum.get("value", "")), expected["value"])
                  else "signed" if method == "hmac-sha256" else "checksum")
    else:
        status = "tampered"
    return Verified(str(doc.get("student", "")), labs, status, str(doc.get("written", "")))


def class_rows(verified: Verified, source: str = "") -> list[dict[str, Any]]:
    """One row per task tried: student, lab, task, passed, attempts, time (of the pass, else of the
    last check, UTC) and the file it came from."""
    rows = []
    for lab_id, lab in verified.labs.items():
        for task_id, data in lab["tasks"].items():
            rec = _record(data)
            rows.append({"student": verified.student, "lab": lab_id, "task": task_id, "passed": rec.passed,
                         "attempts": rec.attempts, "time": rec.passed_when if rec.passed else rec.when,
                         "file": source})
    return rows


def _record_data(rec: TaskRecord) -> dict[str, Any]:
    data = asdict(rec)
    data["evidence"], data["passed_evidence"] = list(rec.evidence), list(rec.passed_evidence)
    return data


def _record(data: Mapping[str, Any]) -> TaskRecord:
    known = {k: v for k, v in data.items() if k in _RECORD_FIELDS}
    rec = TaskRecord(**known)
    rec.evidence, rec.passed_evidence = tuple(rec.evidence), tuple(rec.passed_evidence)
    return rec


def _key(environ: Mapping[str, str] | None) -> str:
    return (os.environ if environ is None else environ).get(TEACHER_KEY_ENV, "")


def _checksum(body: Mapping[str, Any], key: str) -> dict[str, str]:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
    if key:
        digest = hmac.new(key.encode(), canonical, hashlib.sha256).hexdigest()
        return {"method": "hmac-sha256", "value": digest}
    return {"method": "sha256", "value": hashlib.sha256(canonical).hexdigest()}


def _md(text: Any) -> str:
    """Text safe for Markdown (a table cell too): no link, image, markup or table break."""
    return markdown_text(text)
