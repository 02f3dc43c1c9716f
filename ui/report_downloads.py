"""A report's downloads, the same on every page: HTML (offline), JSON, Markdown and PDF, each made
only when its button is pressed (the PDF by the command line's printer, ``Report.to_pdf``)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import streamlit as st

from inspector import Report
from inspector.report import CHROMIUM


def pdf_bytes(report: Report) -> bytes:
    """``report`` printed by Chromium (:func:`inspector.report.render_pdf`), as bytes."""
    with tempfile.TemporaryDirectory(prefix="inspector-pdf-") as tmp:
        return report.to_pdf(Path(tmp) / "report.pdf").read_bytes()


def report_downloads(make: Report | Callable[[], Report], stem: str, key: str) -> None:
    """Four download buttons in a row for the report ``make`` is or makes; nothing is built or rendered
    until a button is pressed (a page that reruns every few seconds renders nothing)."""
    def report() -> Report:
        return make if isinstance(make, Report) else make()

    d1, d2, d3, d4 = st.columns(4)
    d1.download_button("HTML (interactive, offline)", lambda: report().to_html(), f"{stem}.html", "text/html",
                       key=f"{key}_html")
    d2.download_button("JSON (machine-readable)", lambda: report().to_json(), f"{stem}.json",
                       "application/json", key=f"{key}_json")
    d3.download_button("Markdown (for an issue tracker)", lambda: report().to_markdown(), f"{stem}.md",
                       "text/markdown", key=f"{key}_md")
    if os.access(CHROMIUM, os.X_OK):
        d4.download_button("PDF (printed by Chromium)", lambda: pdf_bytes(report()), f"{stem}.pdf",
                           "application/pdf", key=f"{key}_pdf")
    else:
        d4.caption(f"PDF needs Chromium at {CHROMIUM}; download the HTML and print it from a browser.")
