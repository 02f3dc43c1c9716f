"""A report rendered: one offline HTML file, Markdown, a PDF printed by Chromium; its JSON schema."""

from __future__ import annotations

import base64
import functools
import json
import lzma
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ..utils.escaping import markdown_text, visible_text
from ..utils.findings import Finding, InspectorError
from ..utils.units import format_bytes, format_count
from .data import Section, Table
from .options import DEFAULT_OPTIONS, SECTION_TITLES

SCHEMA_VERSION = "1.0"
SCHEMA_PATH = Path(__file__).parent.parent / "report_schema.json"
TEMPLATE_DIR = Path(__file__).parent.parent / "templates"
CHROMIUM = "/usr/bin/chromium"


class Rendered(Protocol):
    """What rendering reads of a report (:class:`~.model.Report`, which renders itself through here)."""

    @property
    def model(self) -> dict[str, Any]: ...
    @property
    def options(self) -> dict[str, Any]: ...
    @property
    def sections(self) -> tuple[Section, ...]: ...
    @property
    def created(self) -> str: ...
    @property
    def environment(self) -> dict[str, Any]: ...
    @property
    def schema_version(self) -> str: ...
    @property
    def findings(self) -> list[tuple[str, Finding]]: ...


def _environment_jinja() -> Any:
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                             finalize=_visible)
    env.filters["cell"] = display_value
    env.filters["key"] = display_key
    return env


def _visible(value: Any) -> Any:
    """Every text the template shows: controls and bidirectional overrides as visible escapes."""
    import markupsafe

    return value if isinstance(value, markupsafe.Markup) or not isinstance(value, str) else \
        visible_text(value, keep_lines=True)


def is_bytes_key(column: Any) -> bool:
    """Whether a column or fact holds a byte count: ``bytes``, ``nbytes``, ``total_bytes``, ``bytes_…``."""
    text = str(column)
    return text in ("bytes", "nbytes") or text.endswith("_bytes") or text.startswith("bytes_")


def is_count_key(column: Any) -> bool:
    """Whether a column or fact counts elements or parameters (``parameter_elements``, ``numel``)."""
    text = str(column)
    return "elements" in text or "numel" in text


def display_key(key: Any) -> str:
    """A fact's key as words: ``parameter_elements`` reads ``parameter elements``."""
    return str(key).replace("_", " ")


def display_value(value: Any, column: Any = "") -> str:
    """How a table cell reads for people: lists joined by commas, None as empty, byte counts in
    binary units, counts with thousands separators, and an element count of a million or more also
    in words (the JSON keeps the exact numbers).

    >>> display_value(155_171_243_763, "bytes"), display_value(4592), display_value(262_144_000)
    ('144.5 GiB', '4,592', '262,144,000')
    >>> display_value(68_976_648_192, "parameter_elements")
    '69.0 billion (68,976,648,192)'
    """
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int) and is_bytes_key(column):
        return format_bytes(value)
    if isinstance(value, int) and is_count_key(column) and abs(value) >= 1_000_000:
        return f"{format_count(value)} ({value:,})"
    if isinstance(value, int) and abs(value) >= 1_000:
        return f"{value:,}"
    if isinstance(value, list):
        return ", ".join(display_value(v) for v in value)
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {display_value(v)}" for k, v in value.items())
    return str(value)


def _script_json(data: Any) -> str:
    """JSON safe inside a <script> element: no '<', '>' or '&' characters left."""
    text = json.dumps(data, sort_keys=True, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


B85 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz!#$%&()*+-;<=>?@^_`{|}~"  # b85encode's
# printable ASCII without quotes, '&', '>' and '<' (so no "</script" can appear), 85 characters
PACK_ALPHABET = "".join(c for c in map(chr, range(33, 127)) if c not in "\"'<>&\\`$~")


@dataclass(frozen=True)
class PackedScript:
    """A script packed for a page: LZMA (``lzma.FORMAT_ALONE``) in base 85 over ``PACK_ALPHABET``, which
    the page's ``unpack.js`` turns back into ``size`` bytes of UTF-8 (``packed`` bytes before base 85)."""

    text: str
    packed: int
    size: int

    def unpack(self) -> str:
        """The script again, as the page unpacks it."""
        data = base64.b85decode(self.text.translate(str.maketrans(PACK_ALPHABET, B85)))[: self.packed]
        return lzma.decompress(data, format=lzma.FORMAT_ALONE).decode("utf-8")


def pack_script(source: str) -> PackedScript:
    """``source`` packed for :class:`PackedScript` (4.8 MB of plotly.js become 1.39 MB of text)."""
    raw = source.encode("utf-8")
    packed = lzma.compress(raw, format=lzma.FORMAT_ALONE,
                           filters=[{"id": lzma.FILTER_LZMA1, "preset": 9, "lc": 4, "pb": 0}])
    text = base64.b85encode(packed, pad=True).decode("ascii").translate(str.maketrans(B85, PACK_ALPHABET))
    return PackedScript(text, len(packed), len(raw))


@functools.cache
def packed_plotlyjs() -> PackedScript:
    """The installed plotly.js, packed once per process (about 3 s)."""
    from plotly.offline import get_plotlyjs

    return pack_script(get_plotlyjs())


def render_html(report: Rendered) -> str:
    """The report as one offline HTML file; every name passes through jinja2's autoescape. plotly.js
    travels packed (:func:`packed_plotlyjs`) and is unpacked by the page itself, without a request."""
    import markupsafe

    figures = []
    for s in report.sections:
        for i, f in enumerate(s.figures):
            figures.append({"id": f"fig-{s.id}-{i}", "data": f.figure.get("data", []),
                            "layout": f.figure.get("layout", {})})
    template = _environment_jinja().get_template("report.html.j2")
    return template.render(
        report=report, report_kind=report_kind(report), findings=report.findings, titles=SECTION_TITLES,
        figure_count=len(figures),
        plotly=packed_plotlyjs() if figures else None, alphabet=PACK_ALPHABET,
        figures_json=markupsafe.Markup(_script_json(figures)),
    )


def report_kind(report: Rendered) -> str:
    """``Run report`` for a run file's report, else ``Model report``."""
    return "Run report" if str(report.model.get("class", "")).endswith(" run") else "Model report"


def _md(value: Any, column: Any = "") -> str:
    """A value as literal Markdown text: no link, image, markup or table break survives."""
    return markdown_text(display_value(value, column))


def _md_table(table: Table, max_rows: int) -> list[str]:
    if not table.columns:
        return []
    lines = ["| " + " | ".join(_md(c) for c in table.columns) + " |",
             "|" + "|".join(" --- " for _ in table.columns) + "|"]
    for row in table.rows[:max_rows]:
        if table.columns == ("key", "value"):  # a fact names itself, in words
            lines.append(f"| {markdown_text(display_key(row[0]))} | {_md(row[1], row[0])} |")
            continue
        lines.append("| " + " | ".join(_md(v, c) for v, c in zip(row, table.columns, strict=True)) + " |")
    if len(table.rows) > max_rows:
        lines.append("")
        lines.append(f"_{len(table.rows) - max_rows} more rows in the JSON or HTML report._")
    return lines


def render_markdown(report: Rendered) -> str:
    """The report as Markdown: one heading per section, pipe tables, figures as tables."""
    max_rows = int(report.options.get("max_rows") or DEFAULT_OPTIONS["max_rows"])
    m = report.model
    out = [f"# {report_kind(report)}: {_md(m.get('name'))}", "",
           f"Source {_md(m.get('source'))}" + (f" on {_md(m.get('device'))}" if m.get("device") else "")
           + (f", dtype {_md(m.get('dtype'))}" if m.get("dtype") else "")
           + (f", checkpoint {_md(m.get('checkpoint'))}" if m.get("checkpoint") else "")
           + f". Created {_md(report.created)}; schema {_md(report.schema_version)}.", ""]
    for s in report.sections:
        out += [f"## {_md(s.title)}", ""]
        if s.id == "findings":
            out += [f"**{_md(s.note)}**", ""] if s.note else []
            pairs = report.findings
            if not pairs:
                out += ["No findings.", ""]
                continue
            rows = tuple((f.severity, f.code, f.where, f.message, SECTION_TITLES.get(sid, sid))
                         for sid, f in pairs)
            out += _md_table(Table("", ("severity", "code", "where", "message", "section"), rows),
                             len(rows)) + [""]
            continue
        if s.status != "ok":
            out += [f"**{s.status.capitalize()}:** {_md(s.note)}", ""]
            continue
        if s.note:
            out += [_md(s.note), ""]
        if s.facts:
            out += _md_table(Table.from_mapping("", s.facts), max_rows) + [""]
        for t in s.tables:
            out += [f"### {_md(t.title)}", ""] + ([_md(t.note), ""] if t.note else [])
            out += _md_table(t, max_rows) + [""]
        for f in s.figures:
            out += [f"### Figure: {_md(f.title)}", ""]
            if f.summary in s.tables:
                out += [f"_Drawn from the table {_md(f.summary.title)} above._", ""]
                continue
            out += (
                ([_md(f.summary.note), ""] if f.summary.note else []) + _md_table(f.summary, max_rows) + [""]
            )
    return "\n".join(out).rstrip() + "\n"


def render_pdf(report: Rendered, path: str | os.PathLike, chromium: str = CHROMIUM,
               timeout: float = 120) -> Path:
    """Print the HTML report to a PDF with Debian's Chromium (``--headless --print-to-pdf``)."""
    exe = shutil.which(chromium) if not os.path.isabs(chromium) else chromium
    if not exe or not os.access(exe, os.X_OK):
        raise InspectorError(
            f"PDF export needs Chromium at {chromium}, which is not there. Install Debian's "
            "chromium package (apt-get install chromium), or export HTML and print it from a browser.")
    out = Path(path).resolve()
    with tempfile.TemporaryDirectory(prefix="inspector-report-") as tmp:
        page = Path(tmp) / "report.html"
        page.write_text(render_html(report), encoding="utf-8")
        cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-dev-shm-usage", "--no-pdf-header-footer", "--run-all-compositor-stages-before-draw",
               "--virtual-time-budget=15000", f"--user-data-dir={tmp}/profile",
               f"--print-to-pdf={out}", page.as_uri()]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise InspectorError(f"Chromium did not finish printing the PDF within {timeout:.0f} s") from None
    if not out.is_file() or out.stat().st_size == 0:
        tail = (done.stderr or done.stdout or "").strip().splitlines()[-3:]
        raise InspectorError(f"Chromium did not write {out} (exit {done.returncode}): {' / '.join(tail)}")
    return out


def load_schema() -> dict[str, Any]:
    """The JSON Schema every ``Report.to_json()`` text satisfies."""
    return json.loads(SCHEMA_PATH.read_text(encoding="utf-8"))
