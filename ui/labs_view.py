"""Streamlit pieces of the Labs page: lab entries, views, answer fields, results, teacher view."""

from __future__ import annotations

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
    record_attempt,
)
from inspector.utils import grid_frame

PROGRESS = "labs_progress"
SCENARIOS = "labs_scenarios"
VIEWS = "labs_views"


def entries() -> list[Lab | LabError]:
    """Every lab and every lab file that failed; a failure of discovery itself is one error entry."""
    try:
        return discover_labs()
    except Exception as exc:  # noqa: BLE001 - the page must stay usable
        return [LabError("labs", "INSPECTOR_LABS_DIR", f"finding labs failed: {type(exc).__name__}: {exc}")]


def progress() -> dict[str, dict[str, TaskRecord]]:
    return st.session_state.setdefault(PROGRESS, {})


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
        st.dataframe(grid_frame(value), hide_index=True, width="stretch")
    elif hasattr(value, "to_plotly_json"):
        st.plotly_chart(value, key=key)
    elif isinstance(value, str):
        st.markdown(value)
    else:
        st.write(value)


def field_key(lab: Lab, task: Task, f: Field) -> str:
    return f"lab_{lab.id}_{task.id}_{f.key}"


def answer_fields(lab: Lab, task: Task, scenario: Scenario) -> dict[str, Any]:
    """One widget per answer field; returns the raw values."""
    raw: dict[str, Any] = {}
    for f in task.fields:
        key = field_key(lab, task, f)
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
    return raw


def is_empty_answer(raw: dict[str, Any]) -> bool:
    """Whether nothing was answered: every field unset, blank or an empty choice.

    >>> is_empty_answer({"a": None, "b": "  ", "c": []}), is_empty_answer({"a": "x", "b": ""})
    (True, False)
    """
    return all(v is None or (isinstance(v, str) and not v.strip()) or (isinstance(v, (list, tuple)) and not v)
               for v in raw.values())


def check_task(lab: Lab, task: Task, scenario: Scenario, raw: dict[str, Any]) -> CheckResult:
    """Grade one task with the lab's checker and record the attempt in this session's progress."""
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
        st.warning(f"You passed this task before; your last answer did not: {rec.message}")
    else:
        st.error(rec.message)
    if rec.evidence:
        with st.expander("What the inspector measured", expanded=rec.passed):
            for line in rec.evidence:
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
