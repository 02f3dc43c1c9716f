"""The Training page's findings: the verdict first, then every finding, each one a way to its step."""

from __future__ import annotations

import streamlit as st

from inspector.utils import grid_frame, markdown_text
from inspector.watching import finding_counts, verdict
from ui.tables import paged_table
from ui.training import Opened, findings_frame, findings_layout, timeline_of


def go_to(step: int) -> None:
    """Move the Training page's step selection to ``step``."""
    st.session_state["train_latest"] = False
    st.session_state["train_step"] = int(step)


def show_verdict(opened: Opened) -> None:
    """The answer first: the run's first error (step, module, what happened) and a button to its step."""
    v = verdict(opened.run)
    with st.container(border=True, key="train_verdict"):
        if v.first is None:
            icon = ":material/warning:" if v.counts["warning"] else ":material/check_circle:"
            st.markdown(f"{icon} {markdown_text(v.line())}")
            return
        left, right = st.columns([6, 1], vertical_alignment="center")
        left.markdown(f":red[:material/error: **{markdown_text(v.line())}**]")
        right.button(f"Go to step {v.first.step:,}", key="train_verdict_go", on_click=go_to,
                     args=(v.first.step,), type="primary")


def show_findings(opened: Opened) -> None:
    """Every finding: counts by code, a timeline to click, a picker to jump to one, the table."""
    found = findings_frame(opened.run)
    st.subheader("Findings")
    if not len(found):
        st.success("No findings: nothing went wrong at any recorded step.")
        return
    st.caption("How often each kind of finding began (a loss spike, a gradient explosion or a NaN/Inf that "
               "comes back after it cleared counts again):")
    st.dataframe(grid_frame(finding_counts(opened.run)), hide_index=True, width="content")
    first, last = int(opened.run.steps["step"].min()), int(opened.run.steps["step"].max())
    event = st.plotly_chart(timeline_of(opened, opened.key, first, last), width="stretch", on_select="rerun",
                            selection_mode="points", key="train_timeline")
    points = (event.selection.points if event and event.selection else None) or []
    picked = int(points[0]["x"]) if points else None
    if picked is not None and st.session_state.get("train_timeline_applied") != picked:
        st.session_state["train_timeline_applied"] = picked
        go_to(picked)
    labels = [
        f"step {s} · {c} · {w}" for s, c, w in zip(found["step"], found["code"], found["where"], strict=True)
    ]
    choice = st.selectbox("Go to the step of a finding", range(len(found)), index=None, key="train_jump",
                          format_func=lambda i: labels[i], placeholder="a finding…")
    if choice is not None and st.session_state.get("train_jump_applied") != choice:
        st.session_state["train_jump_applied"] = choice
        go_to(int(found["step"].iloc[choice]))
    if opened.run.world_size == 1:
        found = found.drop(columns=["rank"])  # one rank: the column says nothing
    paged_table(found, "train_findings", page_size=20, **findings_layout(found))
