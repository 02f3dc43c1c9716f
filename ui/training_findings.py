"""The Training page's findings: the verdict first, then every finding, each one a way to its step.

Data apart from drawing: :func:`verdict_view` returns what the verdict box shows (tested without a
browser); :func:`show_verdict` draws it."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from inspector.report import verdict_line
from inspector.utils import grid_frame, markdown_text, module_label
from inspector.watching import Run, StepFinding, finding_counts, ordered_findings
from ui.tables import paged_table
from ui.training import Opened, findings_frame, findings_layout, timeline_of

MOST_KINDS = 6  # the verdict box lists the first finding of at most this many codes
ICONS = {"error": ":material/error:", "warning": ":material/warning:", "info": ":material/info:",
         "none": ":material/check_circle:"}
COLOURS = {"error": "red", "warning": "orange", "info": "blue", "none": "green"}


@dataclass(frozen=True)
class VerdictView:
    """What the verdict box shows: the run's first finding of its worst severity (``first``; None
    when the run has none), the line that says it, and the first finding of each code (``kinds``,
    most severe first, then by step), each with its place in the findings table (``index``, from 0,
    as ``&finding=`` counts from 1)."""

    severity: str  # "error" | "warning" | "info" | "none"
    line: str
    first: StepFinding | None
    kinds: tuple[tuple[int, StepFinding], ...]
    more_kinds: int


def verdict_view(run: Run) -> VerdictView:
    """The verdict box's data: its line (:func:`inspector.report.verdict_line`: the first error, else the
    first warning in the same shape) and the first finding of each code."""
    ordered = ordered_findings(run)
    first = ordered[0] if ordered else None
    line = verdict_line(ordered)
    if first is None:
        return VerdictView("none", line, None, (), 0)
    kinds: dict[str, StepFinding] = {}
    for f in ordered:
        kinds.setdefault(f.code, f)
    table = ordered_findings(run.findings)  # the rows of the findings table, which &finding= counts
    listed = tuple((table.index(f) if f in table else 0, f) for f in list(kinds.values())[:MOST_KINDS])
    return VerdictView(first.severity, line, first, listed, max(0, len(kinds) - MOST_KINDS))


def go_to(step: int, finding: int | None = None) -> None:
    """Move the Training page's step selection to ``step`` and the address to it (``&step=``, and
    ``&finding=`` counted from 1 when a finding took it there)."""
    st.session_state["train_latest"] = False
    st.session_state["train_step"] = int(step)
    st.session_state["train_finding"] = finding
    st.session_state["train_scroll"] = True  # the step view comes into sight on the next run
    set_address(int(step), finding)


def set_address(step: int | None, finding: int | None = None) -> None:
    """``?run=...&step=N&finding=K`` in the browser's address (step and finding dropped for None), and
    remembered as seen so that the page does not apply it again."""
    params = st.query_params
    for name, value in (("step", step), ("finding", None if finding is None else finding + 1)):
        if value is None:
            params.pop(name, None)
        else:
            params[name] = str(value)
    st.session_state["train_address"] = address_of(params)


def address_of(params) -> tuple[str | None, str | None]:
    """The ``step`` and ``finding`` an address names (None where it names none)."""
    return params.get("step"), params.get("finding")


def apply_address(opened: Opened) -> None:
    """Open the step (or the finding) the address names, once per address: ``?step=N`` picks step N;
    ``?finding=K`` the step of the K-th finding of the findings table (counted from 1)."""
    seen = address_of(st.query_params)
    if seen == st.session_state.get("train_address") or seen == (None, None):
        return
    st.session_state["train_address"] = seen
    step, finding = seen
    if finding is not None and finding.strip().isdigit():
        found = findings_frame(opened.run)
        k = int(finding) - 1
        if 0 <= k < len(found):
            st.session_state["train_latest"] = False
            st.session_state["train_step"] = int(found["step"].iloc[k])
            st.session_state["train_finding"] = k
            return
        st.warning(f"The address names finding {markdown_text(finding)}; this run has {len(found):,}.")
    if step is not None and step.strip().lstrip("-").isdigit():
        st.session_state["train_latest"] = False
        st.session_state["train_step"] = int(step)
        st.session_state["train_finding"] = None
    elif step is not None:
        st.warning(f"The address's step={markdown_text(step)} is no step number: the latest step is shown.")


def show_verdict(opened: Opened) -> None:
    """The answer first: the run's first error, else its first warning (step, module, what happened),
    a button to its step, and the first finding of every other kind, each with its own button."""
    view = verdict_view(opened.run)
    with st.container(border=True, key="train_verdict"):
        icon, colour = ICONS[view.severity], COLOURS[view.severity]
        if view.first is None:
            st.markdown(f"{icon} {markdown_text(view.line)}")
            return
        left, right = st.columns([6, 1], vertical_alignment="center")
        left.markdown(f":{colour}[{icon} **{markdown_text(view.line)}**]")
        index = view.kinds[0][0]
        right.button(f"Go to step {view.first.step:,}", key="train_verdict_go", on_click=go_to,
                     args=(view.first.step, index), type="primary")
        if len(view.kinds) < 2:
            return
        st.caption("The first of each kind:")
        for i, f in view.kinds[1:]:
            left, right = st.columns([6, 1], vertical_alignment="center")
            left.markdown(f"{ICONS.get(f.severity, '')} step {f.step:,} · **{markdown_text(f.code)}** at "
                          f"{markdown_text(module_label(f.where))} — {markdown_text(f.message)}")
            right.button(f"Step {f.step:,}", key=f"train_verdict_go_{i}", on_click=go_to, args=(f.step, i))
        if view.more_kinds:
            st.caption(f"…and {view.more_kinds:,} more kinds below, under Findings.")


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
    st.plotly_chart(timeline_of(opened, opened.key, first, last), width="stretch", on_select=_timeline_picked,
                    selection_mode="points", key="train_timeline")
    labels = [
        f"step {s} · {c} · {w}" for s, c, w in zip(found["step"], found["code"], found["where"], strict=True)
    ]
    st.selectbox("Go to the step of a finding", range(len(found)), index=None, key="train_jump",
                 format_func=lambda i: labels[i], placeholder="a finding…", on_change=_finding_picked,
                 args=(found["step"].tolist(),))
    if opened.run.world_size == 1:
        found = found.drop(columns=["rank"])  # one rank: the column says nothing
    paged_table(found, "train_findings", page_size=20, **findings_layout(found))


def _timeline_picked() -> None:
    """A point clicked on the findings timeline: its step (before the page draws anything)."""
    event = st.session_state.get("train_timeline")
    points = (event.selection.points if event and event.selection else None) or []
    if points:
        go_to(int(points[0]["x"]))


def _finding_picked(steps: list[int]) -> None:
    """A finding picked in the list: its step, and its number in the address."""
    choice = st.session_state.get("train_jump")
    if choice is not None:
        go_to(int(steps[choice]), int(choice))


def keep_address(step: int | None) -> None:
    """The address follows the step picked by hand (``&step=N``), or drops it while following the latest;
    ``&finding=K`` stays while its finding's step is the one shown."""
    current = st.query_params.get("step")
    if step is None and current is None or step is not None and current == str(step):
        return
    set_address(step, st.session_state.get("train_finding") if step is not None else None)
