"""Report: every analysis of the loaded model in one file to share (HTML, JSON, Markdown, PDF)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import streamlit as st

from inspector.escaping import markdown_text
from inspector.report import CHROMIUM, SECTION_TITLES, SECTIONS, build_report
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.sidebar import model_picker

st.set_page_config(page_title="Report", layout="wide")
loaded = model_picker()

st.title("Report")
st.caption("Everything the inspector finds about this model in one file: attach it to a bug report, "
           "hand it in for a lab, or diff the JSON against last week's model. The report runs the same "
           "analyses as the other pages; findings come first, each linking to its section.")

if loaded is None:
    st.info("Load a model in the sidebar to build its report.")
    st.stop()

choices = [s for s in SECTIONS if s != "findings"]
with st.form("report_options"):
    picked = st.multiselect("Sections", choices, default=choices, format_func=SECTION_TITLES.get,
                            help="The findings list is always included, at the top.")
    left, right = st.columns(2)
    batch_size = left.number_input("Batch size of the example inputs", min_value=1, max_value=64,
                                   value=2, step=1)
    backward = right.checkbox("Run one backward pass for gradient norms", value=False,
                              help="The model's earlier .grad values are put back afterwards.")
    max_memory = left.text_input("Device budget for a device-map plan (optional)",
                                 placeholder="0=20GiB,1=20GiB,cpu=64GiB", key="report_budget")
    steps = right.number_input("Attribution steps (integrating methods)", min_value=1, max_value=300,
                               value=50, step=1, help="Fewer steps are faster on big models on a CPU.")
    submitted = st.form_submit_button("Build report", type="primary")

if submitted:
    st.session_state["report_request"] = (tuple(picked), int(batch_size), bool(backward),
                                          max_memory.strip() or None, int(steps))

request = st.session_state.get("report_request")
if request is None:
    st.info("Choose the sections and press **Build report**.")
    st.stop()

sections, batch_size, backward, max_memory, steps = request
report = None
with guarded("building the report"), st.spinner("Running the analyses…"):
    report = cached_analysis(build_report, loaded, list(sections), cache_scope="session",
                             batch_size=batch_size, backward=backward, max_memory=max_memory,
                             attribution_steps=steps)
if report is None:
    st.stop()

counts = {sev: sum(1 for _, f in report.findings if f.severity == sev) for sev in ("error", "warning", "info")}
c1, c2, c3, c4 = st.columns(4)
c1.metric("Errors", counts["error"])
c2.metric("Warnings", counts["warning"])
c3.metric("Info", counts["info"])
c4.metric("Sections", sum(1 for s in report.sections if s.status == "ok"))
for s in report.sections:
    if s.status != "ok":
        (st.error if s.status == "error" else st.warning)(f"{s.title}: {s.status} — {markdown_text(s.note)}")

stem = f"report-{loaded.name}".replace("/", "_").replace(":", "_")
st.subheader("Download")
d1, d2, d3, d4 = st.columns(4)
markdown = None
pdf_key = (st.session_state["mi_selection"].key, request)
with guarded("rendering the report"):
    d1.download_button("HTML (interactive, offline)", report.to_html(), f"{stem}.html", "text/html",
                       key="dl_html")
    d2.download_button("JSON (machine-readable)", report.to_json(), f"{stem}.json", "application/json",
                       key="dl_json")
    markdown = report.to_markdown()
    d3.download_button("Markdown (for an issue tracker)", markdown, f"{stem}.md", "text/markdown",
                       key="dl_md")
    if os.access(CHROMIUM, os.X_OK):
        if d4.button("Make PDF", key="make_pdf"):
            with st.spinner("Printing with Chromium…"), tempfile.TemporaryDirectory() as tmp:
                st.session_state["report_pdf"] = (pdf_key, report.to_pdf(Path(tmp) / "report.pdf").read_bytes())
        pdf = st.session_state.get("report_pdf")
        if pdf is not None and pdf[0] == pdf_key:
            d4.download_button("PDF", pdf[1], f"{stem}.pdf", "application/pdf", key="dl_pdf")
    else:
        d4.caption(f"PDF needs Chromium at {CHROMIUM}; download the HTML and print it from a browser.")

if markdown is not None:
    with st.expander("Preview (Markdown)", expanded=True):
        st.markdown(markdown)
