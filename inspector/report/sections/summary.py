"""The summary section: sizes, dtypes, devices and the loading findings."""

from __future__ import annotations

from ...summary import model_summary, summary_findings
from ..data import Section, Table, plain
from ..options import SECTION_TITLES
from .context import Context


def summary_section(ctx: Context) -> Section:
    s = model_summary(ctx.model)
    facts = {k: v for k, v in s.as_dict().items() if k != "bytes"}
    findings = [*ctx.loaded.findings, *summary_findings(s)]
    return Section("summary", SECTION_TITLES["summary"], facts=plain(facts),
                   tables=(Table.from_frame("Bytes by kind, dtype and device", s.bytes_table),),
                   findings=tuple(findings))
