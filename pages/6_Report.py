"""Report: every analysis of the loaded model in one file to share (HTML, JSON, Markdown, PDF)."""

from __future__ import annotations

import streamlit as st

from inspector import SECTIONS, LoadedModel, Report, build_report
from inspector.report import SECTION_TITLES
from inspector.utils import markdown_text
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.report_downloads import report_downloads
from ui.sidebar import model_picker

MAX_BATCH, MAX_STEPS = 64, 300
BATCH_LABEL, STEPS_LABEL = "Batch size of the example inputs", "Attribution steps (integrating methods)"
ANY_SIZE = "Attribute models of any size on the CPU"
BACKWARD_LABEL = "Run one backward pass for gradient norms"
CONVERSIONS_LABEL = "Check every conversion, whatever the model's size"
# How a reader of this page turns each option on: the report names these controls, not arguments.
CONTROLS = {
    "backward": f"tick “{BACKWARD_LABEL}” on the Report page and build the report again",
    "conversions": f"tick “{CONVERSIONS_LABEL}” on the Report page to run them",
    "attribution_cpu_max_bytes": f"tick “{ANY_SIZE}” on the Report page (and perhaps lower “{STEPS_LABEL}”) "
                                 "to run it here",
    "lab": "check an answer on the Labs page, then build the report again",
    "compare_with": "compare on the Compare page, or run `python -m inspector report ... --compare-with B`",
}


def _header() -> LoadedModel | None:
    """Title, explanation and the loaded model (None when there is none)."""
    loaded = model_picker()

    st.title("Report")
    st.caption("Everything the inspector finds about this model in one file: attach it to a bug report, "
               "hand it in for a lab, or diff the JSON against last week's model. The report runs the same "
               "analyses as the other pages; findings come first, each linking to its section.")

    if loaded is None:
        st.info("Load a model in the sidebar to build its report.")
    return loaded


def _options() -> None:
    """The form of sections and options; a valid submission becomes this session's report request."""
    choices = [s for s in SECTIONS if s != "findings"]
    with st.form("report_options"):
        picked = st.multiselect(
            "Sections",
            choices,
            default=[c for c in choices if c != "compare"],  # needs a B
            format_func=SECTION_TITLES.get,
            help="The findings list is always included, at the top.",
        )
        left, right = st.columns(2)
        batch_size = left.number_input(BATCH_LABEL, min_value=1, value=2, step=1, help=f"1 to {MAX_BATCH}")
        backward = right.checkbox(BACKWARD_LABEL, value=False,
                                  help="The model's earlier .grad values are put back afterwards.")
        max_memory = left.text_input("Device budget for a device-map plan (optional)",
                                     placeholder="0=20GiB,1=20GiB,cpu=64GiB", key="report_budget")
        steps = right.number_input(STEPS_LABEL, min_value=1, value=50, step=1,
                                   help=f"1 to {MAX_STEPS}. Fewer steps are faster on big models on a CPU.")
        any_size = right.checkbox(
            ANY_SIZE,
            value=False,
            key="report_any_size",
            help="By default models over 64 MiB on a CPU are left out of the attribution "
            "section: it runs about 50 forward and backward passes.",
        )
        every_conversion = left.checkbox(CONVERSIONS_LABEL, value=False, key="report_conversions",
                                         help="By default the conversion checks run on models up to 64 MiB: "
                                              "each one copies the model.")
        submitted = st.form_submit_button("Build report", type="primary")

    if submitted:
        if not 1 <= batch_size <= MAX_BATCH:
            st.error(f"A batch of {int(batch_size):,} example inputs is too many: choose 1 to {MAX_BATCH} in "
                     f"**{BATCH_LABEL}** and press **Build report** again.")
        elif not 1 <= steps <= MAX_STEPS:
            st.error(f"{int(steps):,} attribution steps are too many: choose 1 to {MAX_STEPS} in "
                     f"**{STEPS_LABEL}** and press **Build report** again.")
        else:
            st.session_state["report_request"] = (tuple(picked), int(batch_size), bool(backward),
                                                  max_memory.strip() or None, int(steps), bool(any_size),
                                                  bool(every_conversion))


def _build(loaded: LoadedModel, request: tuple) -> Report | None:
    """The report for the request (kept for this session), with a progress bar; None when it failed."""
    sections, batch_size, backward, max_memory, steps, any_size, every_conversion = request
    report = None
    with guarded("building the report"):
        bar = st.progress(0.0, text="Running the analyses…")
        total = len(sections)
        done: list[str] = []

        def progress(line: str) -> None:
            """build_report calls this before each section (and after a slow one, with its time)."""
            if line.startswith("report section") and " took " not in line:
                done.append(line)
                bar.progress(min(len(done) - 1, total) / max(total, 1),
                             text=f"Section {len(done)} of {total}: {line.partition(': ')[2]}…")

        extra = {"attribution_cpu_max_bytes": None} if any_size else {}
        extra |= {"conversions": "all"} if every_conversion else {}
        # This session's gradients (Flatten map's backward pass), never another session's .grad.
        mine = st.session_state.get("offsets_grads", {}).get(st.session_state["mi_selection"].key)
        grads = mine.grads if mine is not None else {}
        # The lambda keeps the callback and the gradients out of the cache key (cache_key stands for them).
        report = cached_analysis(
            lambda *a, **k: build_report(*a, progress=progress, gradients=grads, **k),
            loaded,
            list(sections),
            cache_scope="session",
            cache_key=id(mine),
            batch_size=batch_size,
            backward=backward,
            max_memory=max_memory,
            attribution_steps=steps,
            controls=CONTROLS,
            **extra,
        )
        bar.empty()
    return report


def _overview(report: Report) -> None:
    """Findings by severity, and the sections that did not run."""
    counts = {
        sev: sum(1 for _, f in report.findings if f.severity == sev) for sev in ("error", "warning", "info")
    }
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Errors", counts["error"])
    c2.metric("Warnings", counts["warning"])
    c3.metric("Info", counts["info"])
    c4.metric("Sections", sum(1 for s in report.sections if s.status == "ok"))
    for s in report.sections:
        if s.status != "ok":
            (st.error if s.status == "error" else st.warning)(
                f"{s.title}: {s.status} — {markdown_text(s.note)}"
            )


def _downloads(loaded: LoadedModel, report: Report) -> str | None:
    """HTML, JSON, Markdown and PDF downloads; returns the Markdown (None when rendering failed)."""
    stem = f"report-{loaded.name}".replace("/", "_").replace(":", "_")
    st.subheader("Download")
    markdown = None
    with guarded("rendering the report"):
        report_downloads(report, stem, "dl")
        markdown = report.to_markdown()
    return markdown


def main() -> None:
    st.set_page_config(page_title="Report", layout="wide")
    loaded = _header()
    if loaded is None:
        return
    _options()
    request = st.session_state.get("report_request")
    if request is None:
        st.info("Choose the sections and press **Build report**.")
        return
    report = _build(loaded, request)
    if report is None:
        return
    _overview(report)
    markdown = _downloads(loaded, report)
    if markdown is not None:
        with st.expander("Preview (Markdown)", expanded=True):
            st.markdown(markdown)


main()
