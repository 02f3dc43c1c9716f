"""A report: what ``build_report`` found, as plain data; its JSON form is the source of truth.

``Report.from_json(report.to_json())`` gives the same report back, and the HTML and Markdown
forms are rendered from the same data.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..utils.escaping import json_visible
from ..utils.findings import SEVERITY_ORDER, Finding, InspectorError
from ..utils.program import program_name
from .data import ReportFigure, Section, Table
from .render import CHROMIUM, SCHEMA_VERSION, render_html, render_markdown, render_pdf


@dataclass(frozen=True)
class Report:
    """What ``build_report`` found; render it with ``to_json``, ``to_html``, ``to_markdown``, ``to_pdf``.

    ``findings`` lists every section's findings, most severe first, each with its section id.
    """

    model: dict[str, Any] = field(hash=False)
    options: dict[str, Any] = field(hash=False)
    sections: tuple[Section, ...]
    created: str
    environment: dict[str, Any] = field(default_factory=dict, hash=False)
    schema_version: str = SCHEMA_VERSION

    @property
    def findings(self) -> list[tuple[str, Finding]]:
        """``(section id, finding)`` pairs, most severe first, in section order within a severity."""
        pairs = [(s.id, f) for s in self.sections for f in s.findings]
        return sorted(pairs, key=lambda p: SEVERITY_ORDER[p[1].severity])

    def section(self, section_id: str) -> Section:
        for s in self.sections:
            if s.id == section_id:
                return s
        raise KeyError(f"this report has no section {section_id!r}; it has "
                       f"{', '.join(s.id for s in self.sections)}")

    # -- JSON -------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "created": self.created,
            "model": dict(self.model),
            "options": dict(self.options),
            "environment": dict(self.environment),
            "findings": [{**f.to_dict(), "section": sid} for sid, f in self.findings],
            "sections": [s.to_dict() for s in self.sections],
        }

    def to_json(self, indent: int | None = 1) -> str:
        """Every table, figure and finding as JSON with sorted keys: two reports diff cleanly."""
        return json_visible(json.dumps(self.to_dict(), indent=indent, sort_keys=True, ensure_ascii=False,
                                       allow_nan=False))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Report:
        if str(d.get("schema_version", "")).split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise InspectorError(f"report schema version {d.get('schema_version')!r} is not supported; "
                                 f"this inspector reads version {SCHEMA_VERSION}")
        by_section: dict[str, list[Finding]] = {}
        for f in d.get("findings", []):
            by_section.setdefault(f["section"], []).append(
                Finding(f["code"], f["severity"], f["where"], f["message"]))
        sections = tuple(
            Section(s["id"], s["title"], s["status"], s.get("note", ""), dict(s.get("facts", {})),
                    tuple(Table.from_dict(t) for t in s.get("tables", [])),
                    tuple(ReportFigure.from_dict(f) for f in s.get("figures", [])),
                    tuple(by_section.get(s["id"], [])))
            for s in d["sections"])
        return cls(dict(d["model"]), dict(d["options"]), sections, d["created"],
                   dict(d.get("environment", {})), d["schema_version"])

    @classmethod
    def from_json(cls, text: str) -> Report:
        """The report a ``to_json`` text describes.

        >>> r = Report({"name": "m"}, {}, (Section("summary", "Summary"),), "2024-01-01T00:00:00+00:00")
        >>> Report.from_json(r.to_json()) == r
        True
        """
        if not isinstance(text, (str, bytes, bytearray)):
            raise InspectorError(
                f"not a report: expected the JSON text of a report, got {type(text).__name__}"
            )
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InspectorError(f"not a report: the text is not JSON ({exc}); give a file written by "
                                 f"'{program_name()} report --format json'") from None
        if not isinstance(data, Mapping):
            raise InspectorError(f"not a report: the JSON holds {type(data).__name__}, not an object; give "
                                 f"a file written by '{program_name()} report --format json'")
        try:
            return cls.from_dict(data)
        except InspectorError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
            raise InspectorError(f"not a report: the JSON does not follow the report schema ({what}); "
                                 f"give a file written by '{program_name()} report --format json'") from None

    # -- HTML / Markdown / PDF ----------------------------------------------------------

    def to_html(self) -> str:
        """One self-contained HTML file: plotly.js inlined once, every figure interactive, offline."""
        return render_html(self)

    def to_markdown(self) -> str:
        """Headings and pipe tables for an issue tracker; figures appear as their summary tables."""
        return render_markdown(self)

    def to_pdf(self, path: str | os.PathLike, chromium: str = CHROMIUM, timeout: float = 120) -> Path:
        """Print the HTML form to ``path`` with headless Chromium; returns the path."""
        return render_pdf(self, path, chromium=chromium, timeout=timeout)

