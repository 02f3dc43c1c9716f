"""Streamlit pieces of the Labs page: lab entries, views, answer fields, results, teacher view.

A student's work (answers typed, checks, the name) lives in one record per browser tab, kept on the
server under a random token in the address (``?labs=...``): switching labs keeps it, a reload of the
page finds it again, a server restart loses it (the results file the student downloads brings it
back).
"""

from __future__ import annotations

import re
import secrets
from typing import Any

import pandas as pd
import streamlit as st

from inspector.labs import (
    CheckResult,
    Field,
    Lab,
    LabError,
    Scenario,
    Task,
    TaskRecord,
    discover_labs,
    grade,
    hints_to_show,
    lab_done,
    read_results,
    record_attempt,
    results_document,
)
from inspector.utils import markdown_text
from ui.tables import show_frame

STORE = "labs_store"
SCENARIOS = "labs_scenarios"
VIEWS = "labs_views"
NOTICE = "labs_notice"
_TOKEN = re.compile(r"[A-Za-z0-9_-]{16,64}")
_MAX_SAVED = 5000  # students' records kept by one server; the oldest goes first


@st.cache_resource
def _saved() -> dict[str, dict[str, Any]]:
    """Every tab's record on this server, by token (shared by all sessions: tokens are unguessable)."""
    return {}


def store() -> dict[str, Any]:
    """This tab's record: ``progress`` (lab -> task -> TaskRecord), ``drafts`` (typed answers), ``lab``
    (the lab open) and ``student``; found again after a reload through the address's token."""
    if STORE not in st.session_state:
        saved = _saved()
        token = str(st.query_params.get("labs", ""))
        if not _TOKEN.fullmatch(token):
            token = secrets.token_urlsafe(18)
        if token not in saved:
            while len(saved) >= _MAX_SAVED:
                saved.pop(next(iter(saved)))
            saved[token] = {"progress": {}, "drafts": {}, "lab": None, "student": ""}
        st.session_state[STORE] = saved[token]
        if st.query_params.get("labs") != token:
            st.query_params["labs"] = token
    return st.session_state[STORE]


def entries() -> list[Lab | LabError]:
    """Every lab and every lab file that failed; a failure of discovery itself is one error entry."""
    try:
        return discover_labs()
    except Exception as exc:  # noqa: BLE001 - the page must stay usable
        return [LabError("labs", "INSPECTOR_LABS_DIR", f"finding labs failed: {type(exc).__name__}: {exc}")]


def progress() -> dict[str, dict[str, TaskRecord]]:
    return store()["progress"]


def lab_sidebar(lab: Lab, scenario: Scenario | None) -> None:
    """The sidebar while a lab is open: the lab's own model (the model picker of the other pages is not
    used here), nothing that could give an answer away."""
    with st.sidebar:
        st.header(":material/school: Lab")
        st.markdown(f"**{markdown_text(lab.title)}**")
        if scenario is not None:
            st.caption(f"Model: {markdown_text(scenario.loaded.name)}. Each student works on a copy of their "
                       "own; the model picked on the other pages is not used here.")


def lab_label(lab: Lab) -> str:
    done = lab_done(lab, progress())
    mark = ":green[:material/check_circle:] " if done == len(lab.tasks) else ""
    return f"{mark}{lab.title} ({done}/{len(lab.tasks)})"


def scenario_for(lab: Lab, fresh: bool = False) -> Scenario:
    """This session's scenario of ``lab``, built once (each student gets their own model)."""
    store = st.session_state.setdefault(SCENARIOS, {})
    key = (lab.id, lab.source)
    if fresh or key not in store:
        with st.spinner(f"Setting up {lab.title}…"):
            store[key] = lab.build()
        st.session_state.setdefault(VIEWS, {}).pop(lab.id, None)
    return store[key]


def show_views(lab: Lab, scenario: Scenario) -> None:
    """Each view of the lab in an expander; on-demand views (experiments) behind a button."""
    cache = st.session_state.setdefault(VIEWS, {}).setdefault(lab.id, {})
    for i, view in enumerate(lab.views):
        with st.expander(view.title, expanded=not view.on_demand):
            if view.after and not getattr(progress().get(lab.id, {}).get(view.after), "passed", False):
                number = next((n for n, t in enumerate(lab.tasks, 1) if t.id == view.after), "")
                st.caption(f"Shown once Task {number} is answered right: this view gives its answer away.")
                continue
            if view.caption:
                st.caption(view.caption)
            if view.on_demand and i not in cache:
                if not st.button("Run the experiment", key=f"lab_run_{lab.id}_{i}"):
                    continue
            if i not in cache:
                try:
                    cache[i] = ("ok", view.build(scenario))
                except Exception as exc:  # noqa: BLE001 - one failing view must not hide the others
                    cache[i] = ("error", f"{type(exc).__name__}: {exc}")
            status, value = cache[i]
            if status == "error":
                st.warning(f"This view is not available: {value}")
            else:
                render(value, key=f"lab_view_{lab.id}_{i}")


def render(value: Any, key: str) -> None:
    """Show what a view returned: DataFrame, plotly figure, markdown text, or a list of those."""
    if isinstance(value, (list, tuple)):
        for j, v in enumerate(value):
            render(v, f"{key}_{j}")
    elif isinstance(value, pd.DataFrame):
        show_frame(value)
    elif hasattr(value, "to_plotly_json"):
        st.plotly_chart(value, key=key)
    elif isinstance(value, str):
        st.markdown(value)
    else:
        st.write(value)


def field_key(lab: Lab, task: Task, f: Field) -> str:
    return f"lab_{lab.id}_{task.id}_{f.key}"


def answer_fields(lab: Lab, task: Task, scenario: Scenario) -> dict[str, Any]:
    """One widget per answer field, starting from what the student typed last (also in another lab's
    visit or before a reload); returns the raw values."""
    drafts = store()["drafts"].setdefault(lab.id, {}).setdefault(task.id, {})
    raw: dict[str, Any] = {}
    for f in task.fields:
        key = field_key(lab, task, f)
        if key not in st.session_state and f.key in drafts and _fits(f, scenario, drafts[f.key]):
            st.session_state[key] = drafts[f.key]
        if f.kind == "choice":
            opts = f.options_for(scenario)
            raw[f.key] = st.selectbox(f.label, opts, index=None, key=key, help=f.help or None,
                                      placeholder="Choose…")
        elif f.kind == "multi":
            raw[f.key] = st.multiselect(f.label, f.options_for(scenario), key=key, help=f.help or None)
        elif f.kind in ("json", "pairs"):
            if key not in st.session_state and f.default_for(scenario) is not None:
                st.session_state[key] = str(f.default_for(scenario))
            raw[f.key] = st.text_area(f.label, key=key, help=f.help or None,
                                      placeholder=f.placeholder or None, height=180)
        else:
            raw[f.key] = st.text_input(f.label, key=key, help=f.help or None,
                                       placeholder=f.placeholder or None)
        drafts[f.key] = list(raw[f.key]) if isinstance(raw[f.key], list) else raw[f.key]
    return raw


def _fits(f: Field, scenario: Scenario, value: Any) -> bool:
    """Whether a kept answer still fits its widget (a choice among the options the model gives now)."""
    if f.kind == "choice":
        return value is None or value in f.options_for(scenario)
    if f.kind == "multi":
        return isinstance(value, list) and set(value) <= set(f.options_for(scenario))
    return isinstance(value, str)


def check_task(lab: Lab, task: Task, scenario: Scenario, raw: dict[str, Any]) -> CheckResult:
    """Grade one task with the lab's checker and record the attempt in this session's progress (an
    incomplete answer is not recorded: ``counted`` is False)."""
    try:
        result = grade(lab, task.id, scenario, raw)
    except Exception as exc:  # noqa: BLE001 - a teacher's checker may fail; say so, keep the page
        result = CheckResult(False, f"The checker of this task failed: {type(exc).__name__}: {exc}")
    record_attempt(progress(), lab.id, task.id, raw, result)
    return result


def show_record(lab: Lab, task: Task) -> None:
    """The last result of a task, its evidence, and the hints earned so far."""
    rec = progress().get(lab.id, {}).get(task.id)
    if rec is None:
        return
    if rec.last_passed:
        st.success(rec.message)
    elif rec.passed:
        st.success(rec.passed_message)
        st.warning(f"You passed this task before (that answer stays in your report); your last answer did "
                   f"not: {rec.message}")
    else:
        st.error(rec.message)
    evidence = rec.evidence if rec.last_passed or not rec.passed else rec.passed_evidence
    if evidence:
        with st.expander("What the inspector measured", expanded=rec.passed):
            for line in evidence:
                st.markdown(f"- {line}")
    for i, hint in enumerate(hints_to_show(task, rec), 1):
        st.info(f"Hint {i}: {hint}")
    st.caption(f"Attempts: {rec.attempts}")


def show_errors(errors: list[LabError]) -> None:
    for e in errors:
        st.error(f"Lab {e.id!r} could not be loaded: {e.message}")
        if e.details:
            with st.expander(f"Details for {e.id}"):
                st.code(e.details)


def show_solutions(lab: Lab, scenario: Scenario) -> None:
    """The teacher view: each task's passing answers and the lab's explanation."""
    for i, task in enumerate(lab.tasks, 1):
        st.markdown(f"**Task {i} ({task.id})**")
        try:
            st.json(task.solution_for(scenario))
        except Exception as exc:  # noqa: BLE001
            st.warning(f"The solution of this task could not be computed: {type(exc).__name__}: {exc}")
        if task.explanation:
            st.markdown(task.explanation)
    if lab.solution:
        st.markdown(lab.solution)


def results_downloads(labs: list[Lab], student: str) -> None:
    """The results file of every lab tried (signed; the teacher collects it, the student continues from
    it), and the upload that continues from one."""
    import json

    doc = results_document(labs, progress(), student)
    st.download_button("Download my results (all labs, for the teacher)", json.dumps(doc, indent=1),
                       "lab-results.json", "application/json", key="lab_dl_results",
                       disabled=not doc["labs"])
    upload = st.file_uploader("Continue from a results file", type=["json", "md"], key="lab_resume",
                              help="The lab-results.json (or a lab report .md) this page wrote: your "
                                   "answers, checks and passes come back.")
    if upload is not None and st.session_state.get("lab_resumed") != upload.file_id:
        st.session_state["lab_resumed"] = upload.file_id
        verified = read_results(upload.getvalue(), upload.name)
        name = markdown_text(upload.name)
        if verified.status == "tampered":
            st.error(f"{name} was changed after this page wrote it (its checksum does not match): "
                     "nothing was taken from it.")
        elif verified.status == "unverifiable":
            st.error(f"{name} was signed with a teacher key this server does not have: nothing was "
                     "taken from it.")
        else:
            resume(verified.progress(), verified.student)
            st.session_state[NOTICE] = (f"Continued from {name}: "
                                        f"{sum(len(t) for t in verified.progress().values())} task record(s) "
                                        f"of {markdown_text(verified.student or 'no name')}.")
            st.rerun()


def resume(records: dict[str, dict[str, TaskRecord]], student: str) -> None:
    """Take the task records of a results file into this tab's record, with their answers in the fields."""
    progress().update(records)
    drafts = store()["drafts"]
    for lab_id, tasks in records.items():
        for task_id, rec in tasks.items():
            drafts.setdefault(lab_id, {})[task_id] = dict(rec.passed_answers if rec.passed else rec.answers)
            for name in [k for k in st.session_state if str(k).startswith(f"lab_{lab_id}_{task_id}_")]:
                del st.session_state[name]  # the fields start again from the answers taken in
    if student:
        store()["student"] = student
        st.session_state.pop("lab_student", None)


def show_notice() -> None:
    """A message left for the run after a rerun (the results taken in from a file)."""
    message = st.session_state.pop(NOTICE, None)
    if message:
        st.success(message)


def report_downloads(lab: Lab, scenario: Scenario, student: str) -> None:
    """Download buttons: the Markdown lab report, and the report module's HTML with the results."""
    from inspector.labs import lab_report_markdown
    from inspector.report import lab_report

    recs = progress().get(lab.id, {})
    st.download_button("Download my lab report (Markdown)", lab_report_markdown(lab, progress(), student),
                       f"lab-{lab.id}.md", "text/markdown", key=f"lab_dl_md_{lab.id}")
    signature = (student, tuple((t, r.attempts) for t, r in sorted(recs.items())))
    slot = f"lab_html_{lab.id}"
    if st.button("Prepare the HTML report (with the model summary)", key=f"lab_html_btn_{lab.id}"):
        st.session_state[slot] = (signature, lab_report(lab, progress(), scenario.loaded, student).to_html())
    stored = st.session_state.get(slot)
    if stored is not None and stored[0] == signature:
        st.download_button("Download the HTML report", stored[1], f"lab-{lab.id}.html", "text/html",
                           key=f"lab_dl_html_{lab.id}")
    elif stored is not None:
        st.caption("Your answers changed since the HTML report was prepared: prepare it again.")
