"""Reports: every analysis of one model in one document, as JSON, HTML, Markdown or PDF.

``build_report`` runs the same public functions the dashboard and the command line run
(summary, alias groups, offsets, placement, captures, attributions, labs), one section
function each (:data:`SECTION_BUILDERS`), and keeps what they return as plain data: tables,
plotly figures and findings. A section whose analysis is not installed, or that cannot run
on this model (a forward pass on the meta device), is kept with ``status`` ``"skipped"`` and
a note saying why; the report never stops there.

The JSON form is the source of truth: ``Report.from_json(report.to_json())`` gives the
same report back, and the HTML and Markdown forms are rendered from the same data.

Modules: ``distributed_run``: a distributed run file as a Report; ``options``: the sections a report can
hold and the options of ``build_report``; ``watch_run``: a watched run file as a Report; ``sections``:
one function per report section; ``build``: ``build_report``; ``data``: the plain data a report is made
of; ``model``: a report: what ``build_report`` found; ``render``: a report rendered.
"""

from __future__ import annotations

from .build import build_report, lab_report, run_section
from .data import ReportFigure, Section, Table, figure_data, make_figure, plain, trace_summary
from .distributed_run import run_report
from .model import Report
from .options import DEFAULT_OPTIONS, SECTION_TITLES, SECTIONS, check_options, check_sections
from .render import (
    CHROMIUM,
    PACK_ALPHABET,
    SCHEMA_PATH,
    SCHEMA_VERSION,
    TEMPLATE_DIR,
    PackedScript,
    display_value,
    load_schema,
    pack_script,
    packed_plotlyjs,
    render_html,
    render_markdown,
    render_pdf,
)
from .sections import SECTION_BUILDERS, Context, SectionBuilder, SectionUnavailable, lab_section
from .watch_run import verdict_line, watch_report

__all__ = ["CHROMIUM", "DEFAULT_OPTIONS", "PACK_ALPHABET", "SCHEMA_PATH", "SCHEMA_VERSION", "SECTIONS",
           "SECTION_BUILDERS", "SECTION_TITLES", "TEMPLATE_DIR", "Context", "PackedScript", "Report",
           "ReportFigure", "Section", "SectionBuilder", "SectionUnavailable", "Table", "build_report",
           "check_options", "check_sections", "display_value", "figure_data", "lab_report", "lab_section",
           "load_schema", "make_figure", "pack_script", "packed_plotlyjs", "plain", "render_html",
           "render_markdown", "render_pdf", "run_report", "run_section", "trace_summary", "verdict_line",
           "watch_report"]
