"""Labs: debug a model with a real, silent bug; the inspector's own analyses grade the answers."""

from __future__ import annotations

import os
from typing import Any

import streamlit as st

from inspector.labs import TEACHER_KEY_ENV, Lab, LabError, is_blank, lab_done, teacher_unlocked
from ui import labs_view as lv
from ui.errors import guarded, install_page_handler
from ui.navigation import leave_pages_folder_mode


def _header() -> list[Lab]:
    """Title, explanation, the labs that could not be loaded; returns the labs that could."""
    leave_pages_folder_mode()
    install_page_handler()

    st.title("Labs")
    st.caption("Each lab hands you a model with a real bug that raises no error. Find it with the views, "
               "answer the questions, and press **Check**: the inspector grades your answer with the same "
               "analyses its pages use. Your answers and checks stay while you switch labs and when you "
               "reload this page; **Download my results** keeps them for good.")
    lv.show_notice()

    found = lv.entries()
    labs = [e for e in found if isinstance(e, Lab)]
    lv.show_errors([e for e in found if isinstance(e, LabError)])
    return labs


def _pick(labs: list[Lab]) -> Lab:
    """Which lab, and how far this session got in it."""
    by_id = {lab.id: lab for lab in labs}
    kept = lv.store()["lab"]
    if "lab_pick" not in st.session_state and kept in by_id:
        st.session_state["lab_pick"] = kept  # the lab open before a reload
    lab_id = st.selectbox("Lab", list(by_id), format_func=lambda i: by_id[i].title, key="lab_pick")
    lv.store()["lab"] = lab_id
    st.caption("Your progress: " + " · ".join(lv.lab_label(lab) for lab in labs))
    lab = by_id[lab_id]
    done = lab_done(lab, lv.progress())
    st.progress(done / len(lab.tasks), text=f"{done} of {len(lab.tasks)} tasks passed")
    return lab


def _story(lab: Lab, scenario: Any) -> None:
    """The lab's story and its views of the model."""
    st.header(lab.title)
    st.markdown(lab.story)
    if lab.views:
        st.subheader("Look at the model")
        with guarded("showing the lab's views"):
            lv.show_views(lab, scenario)


def _tasks(lab: Lab, scenario: Any) -> None:
    """Each task: its question, the answer fields, Check, and the last result."""
    for i, task in enumerate(lab.tasks, 1):
        st.subheader(f"Task {i}")
        st.markdown(task.prompt)
        with guarded(f"showing task {i}"):
            raw = lv.answer_fields(lab, task, scenario)
            checked = st.button("Check", key=f"lab_check_{lab.id}_{task.id}", type="primary")
            if checked:
                with st.spinner("Checking with the inspector's analyses…"):
                    result = lv.check_task(lab, task, scenario, raw)
                if result.counted:
                    st.rerun()  # so the progress line and bar above show this result too
                if all(is_blank(v) for v in raw.values()):
                    st.warning("Give an answer first: an empty answer is not checked, counts no attempt and "
                               "shows no hint.")
                else:
                    st.warning(f"{result.message} This answer is not checked: it counts no attempt and shows "
                               "no hint.")
            lv.show_record(lab, task)


def _my_report(lab: Lab, scenario: Any, labs: list[Lab]) -> None:
    """The student's lab report, and starting the lab again."""
    st.subheader("My lab report")
    if "lab_student" not in st.session_state:
        st.session_state["lab_student"] = lv.store()["student"]
    student = st.text_input("Your name (goes into the report)", key="lab_student")
    lv.store()["student"] = student
    with guarded("making the lab report"):
        lv.report_downloads(lab, scenario, student)
    with guarded("reading the results file"):
        lv.results_downloads(labs, student)
    if st.button("Start this lab again (new model, progress kept)", key=f"lab_reset_{lab.id}"):
        lv.scenario_for(lab, fresh=True)
        st.rerun()


def _teacher_view(lab: Lab, scenario: Any) -> None:
    """The solutions, for whoever has the teacher key."""
    st.subheader("Teacher view")
    if not os.environ.get(TEACHER_KEY_ENV):
        st.caption(f"Solutions are shown to teachers when the server is started with {TEACHER_KEY_ENV} "
                   "set and the same key is entered here.")
    else:
        entered = st.text_input("Teacher key", type="password", key="lab_teacher_key")
        if teacher_unlocked(entered):
            with guarded("showing the solutions"):
                lv.show_solutions(lab, scenario)
        elif entered:
            st.error("That is not the teacher key.")


def main() -> None:
    st.set_page_config(page_title="Labs", layout="wide")
    labs = _header()
    if not labs:
        st.info("No labs found.")
        return
    lab = _pick(labs)
    scenario = None
    with guarded(f"setting up the lab {lab.title}"):
        scenario = lv.scenario_for(lab)
    lv.lab_sidebar(lab, scenario)
    if scenario is None:
        return
    _story(lab, scenario)
    _tasks(lab, scenario)
    st.divider()
    left, right = st.columns(2)
    with left:
        _my_report(lab, scenario, labs)
    with right:
        _teacher_view(lab, scenario)


main()
