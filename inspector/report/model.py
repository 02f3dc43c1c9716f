"""Reports: every analysis of one model in one document, as JSON, HTML, Markdown or PDF.

``build_report`` runs the same public functions the dashboard and the command line run
(summary, alias groups, offsets, placement, captures, attributions, labs) and keeps what
they return as plain data: tables, plotly figures and findings. A section whose analysis
is not installed, or that cannot run on this model (a forward pass on the meta device),
is kept with ``status`` ``"skipped"`` and a note saying why; the report never stops there.

The JSON form is the source of truth: ``Report.from_json(report.to_json())`` gives the
same report back, and the HTML and Markdown forms are rendered from the same data.
"""

from __future__ import annotations

import base64
import importlib
import json
import math
import os
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from torch import nn

from .checks import require_loaded
from .distributed.tensors import kept_sharded
from .escaping import markdown_text
from .findings import SEVERITY_ORDER, Finding, InspectorError
from .summary import model_bytes

SCHEMA_VERSION = "1.0"
SCHEMA_PATH = Path(__file__).with_name("report_schema.json")
TEMPLATE_DIR = Path(__file__).with_name("templates")
CHROMIUM = "/usr/bin/chromium"

SECTION_TITLES: dict[str, str] = {
    "findings": "Findings",
    "summary": "Summary",
    "aliases": "Alias groups and conversions",
    "offsets": "Flat offsets and gradient norms",
    "placement": "Device map: plan and audit",
    "captures": "Activation captures",
    "attribution": "Attributions",
    "labs": "Lab results",
}
SECTIONS: tuple[str, ...] = tuple(SECTION_TITLES)

#: Options ``build_report`` understands, with their defaults; every report records them all.
DEFAULT_OPTIONS: dict[str, Any] = {
    "batch_size": 1,               # example inputs for captures and backward passes
    "backward": False,             # one backward pass for gradient norms (earlier .grad restored after)
    "conversions": "auto",         # conversion checks: "auto", "all", a list of names, or [] for none
    "conversion_max_bytes": 64 << 20,  # "auto" runs every conversion only on models up to this size
    "max_memory": None,            # device budget for the plan, e.g. "0=20GiB,cpu=64GiB" (None: no plan)
    "capture_max_bytes": 256 << 20,    # byte budget of the activation captures
    "attribution_method": None,    # None: the first method that fits the model
    "attribution_target": 0,       # class index or next-token id attributed
    "attribution_layer": None,     # layer for layer methods (None: the method's default)
    "attribution_steps": None,     # n_steps of integrating methods (None: captum's default, 50)
    "attribution_cpu_max_bytes": 64 << 20,  # on a CPU, attribute only models up to this size (None: any)
    "lab": None,                   # a lab id (or Lab) whose results go into the labs section
    "lab_progress": None,          # {lab id: {task id: TaskRecord}} from a labs session (not recorded)
    "gradients": None,             # {parameter name: gradient} to report instead of .grad (not recorded)
    "student": "",
    "max_rows": 60,                # rows per table in Markdown (JSON and HTML keep every row)
}
_UNRECORDED_OPTIONS = ("lab_progress", "gradients")

Progress = Callable[[str], None]


# ---------------------------------------------------------------------------- data


@dataclass(frozen=True)
class Table:
    """A titled table of plain JSON values (str, int, float, bool, None, lists of those)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    note: str = ""

    @classmethod
    def from_frame(cls, title: str, df: pd.DataFrame, note: str = "") -> Table:
        """A table from a DataFrame (its index is dropped; values made JSON-safe)."""
        columns = tuple(str(c) for c in df.columns)
        rows = tuple(tuple(plain(v) for v in row) for row in df.itertuples(index=False, name=None))
        return cls(title, columns, rows, note)

    @classmethod
    def from_mapping(cls, title: str, data: Mapping[str, Any], note: str = "") -> Table:
        """A two-column ``key, value`` table."""
        return cls(title, ("key", "value"), tuple((str(k), plain(v)) for k, v in data.items()), note)

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "columns": list(self.columns),
                "rows": [list(r) for r in self.rows], "note": self.note}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Table:
        return cls(d["title"], tuple(d["columns"]), tuple(tuple(r) for r in d["rows"]), d.get("note", ""))


@dataclass(frozen=True)
class ReportFigure:
    """An interactive plotly figure (as plain JSON) plus the table that summarises it."""

    title: str
    figure: dict[str, Any] = field(hash=False)
    summary: Table

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "figure": self.figure, "summary": self.summary.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReportFigure:
        return cls(d["title"], d["figure"], Table.from_dict(d["summary"]))


@dataclass(frozen=True)
class Section:
    """One part of a report; ``status`` is ``"ok"``, ``"skipped"`` (with a note why) or ``"error"``."""

    id: str
    title: str
    status: str = "ok"
    note: str = ""
    facts: dict[str, Any] = field(default_factory=dict, hash=False)
    tables: tuple[Table, ...] = ()
    figures: tuple[ReportFigure, ...] = ()
    findings: tuple[Finding, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "status": self.status, "note": self.note,
                "facts": dict(self.facts), "tables": [t.to_dict() for t in self.tables],
                "figures": [f.to_dict() for f in self.figures]}


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
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True, ensure_ascii=False,
                          allow_nan=False)

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
            raise InspectorError(f"not a report: expected the JSON text of a report, got {type(text).__name__}")
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise InspectorError(f"not a report: the text is not JSON ({exc}); give a file written by "
                                 "'python -m inspector report --format json'") from None
        if not isinstance(data, Mapping):
            raise InspectorError(f"not a report: the JSON holds {type(data).__name__}, not an object; give "
                                 "a file written by 'python -m inspector report --format json'")
        try:
            return cls.from_dict(data)
        except InspectorError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
            what = f"missing field {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
            raise InspectorError(f"not a report: the JSON does not follow the report schema ({what}); "
                                 "give a file written by 'python -m inspector report --format json'") from None

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


# --------------------------------------------------------------------------- values


def plain(value: Any) -> Any:
    """A JSON-safe, stable form of ``value``: floats to 8 significant digits, NaN/inf as strings.

    >>> plain(np.float32(0.1)), plain(float("nan")), plain((2, np.int64(3)))
    (0.1, 'nan', [2, 3])
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        x = float(value)
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return float(f"{x:.8g}")
    if isinstance(value, np.ndarray):
        return [plain(v) for v in value.tolist()]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [plain(v) for v in items]
    if value is pd.NA or value is pd.NaT:
        return None
    if hasattr(value, "tolist") and callable(value.tolist):  # torch tensors and sizes, numpy scalars
        try:
            return plain(value.tolist())
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def _decode_arrays(obj: Any) -> Any:
    """Plotly's ``{"dtype", "bdata"}`` typed arrays decoded to lists, everything made plain."""
    if isinstance(obj, Mapping):
        if "bdata" in obj and "dtype" in obj:
            arr = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=np.dtype(obj["dtype"]))
            shape = obj.get("shape")
            if shape:
                dims = [int(s) for s in str(shape).split(",")] if isinstance(shape, str) else list(shape)
                arr = arr.reshape(dims)
            return plain(arr)
        return {str(k): _decode_arrays(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_decode_arrays(v) for v in obj]
    return plain(obj)


def figure_data(fig: Any) -> dict[str, Any]:
    """A plotly figure as plain JSON (lists, not base64 typed arrays)."""
    raw = fig.to_plotly_json() if hasattr(fig, "to_plotly_json") else dict(fig)
    return _decode_arrays({"data": raw.get("data", []), "layout": raw.get("layout", {})})


def trace_summary(figure: Mapping[str, Any], title: str = "") -> Table:
    """One row per trace: its name, type, number of points and the range of its values."""
    rows = []
    for i, trace in enumerate(figure.get("data", [])):
        values = trace.get("y") if trace.get("orientation") != "h" else trace.get("x")
        if values is None:
            values = trace.get("z", trace.get("values", trace.get("x", [])))
        flat = list(_flatten(values))
        nums = [v for v in flat if isinstance(v, (int, float)) and not isinstance(v, bool)]
        rows.append((trace.get("name") or f"trace {i}", trace.get("type", "scatter"), len(flat),
                     plain(min(nums)) if nums else None, plain(max(nums)) if nums else None))
    return Table(title or "figure", ("trace", "type", "points", "min", "max"), tuple(rows))


def _flatten(values: Any) -> Iterable[Any]:
    if isinstance(values, (list, tuple)):
        for v in values:
            yield from _flatten(v)
    elif values is not None:
        yield values


def make_figure(title: str, fig: Any, summary: Table | pd.DataFrame | None = None) -> ReportFigure:
    """A report figure from a plotly figure; ``summary`` is the table Markdown shows instead.

    Every axis makes room for its tick labels (long module names are not cut at the edge).
    """
    if hasattr(fig, "update_xaxes"):
        from .figures.palette import readable

        readable(fig)
    data = figure_data(fig)
    if isinstance(summary, pd.DataFrame):
        summary = Table.from_frame(title, summary)
    return ReportFigure(title, data, summary if summary is not None else trace_summary(data, title))


# ------------------------------------------------------------------------- building


class SectionUnavailable(Exception):
    """A section cannot be built here; the message says why. It becomes a skipped section."""


def need(module: str, *names: str) -> Any:
    """``inspector.<module>`` or the named attributes of it; SectionUnavailable if missing."""
    try:
        mod = importlib.import_module(f"{__package__}.{module}")
    except ImportError as exc:
        raise SectionUnavailable(f"inspector.{module} is not available ({exc})") from None
    if not names:
        return mod
    missing = [n for n in names if not hasattr(mod, n)]
    if missing:
        raise SectionUnavailable(f"inspector.{module} has no {', '.join(missing)}")
    values = tuple(getattr(mod, n) for n in names)
    return values[0] if len(values) == 1 else values


@dataclass
class Context:
    """What section builders get: the loaded model, every option, the progress callback."""

    loaded: Any
    options: dict[str, Any]
    progress: Progress

    @property
    def model(self) -> nn.Module:
        return self.loaded.model


SectionBuilder = Callable[[Context], Section]
_BUILDERS: dict[str, SectionBuilder] = {}


def section_builder(section_id: str) -> Callable[[SectionBuilder], SectionBuilder]:
    def register(fn: SectionBuilder) -> SectionBuilder:
        _BUILDERS[section_id] = fn
        return fn
    return register


def build_report(loaded: Any, sections: Iterable[str] | None = None, *,
                 progress: Progress | None = None, **options: Any) -> Report:
    """Run the analyses of ``sections`` (default: all) on a loaded model and keep the results.

    Args:
        loaded: a ``LoadedModel`` (from ``load_model``).
        sections: ids from ``SECTIONS``; ``None`` for all of them. ``"findings"`` is always
            included, first (it lists the other sections' findings, most severe first).
        progress: called with a line of text before each section (the CLI prints it).
        **options: see ``DEFAULT_OPTIONS`` (``batch_size``, ``backward``, ``conversions``,
            ``max_memory``, ``attribution_method``, ``lab``...); unknown names raise InspectorError.

    Returns:
        A Report. Sections that cannot run here are kept as ``"skipped"`` with a note.

    >>> from inspector.models import load_model
    >>> report = build_report(load_model("sample:tiny-gpt2"), ["summary"])
    >>> report.section("summary").facts["parameter_elements"]
    4080
    """
    require_loaded(loaded, "build_report")
    wanted = check_sections(sections)
    opts = check_options(options)
    if "findings" not in wanted:
        wanted.insert(0, "findings")
    ctx = Context(loaded, opts, progress or (lambda _msg: None))
    built = []
    for sid in [s for s in SECTIONS if s in wanted]:
        if sid == "findings":
            built.append(Section("findings", SECTION_TITLES["findings"]))
            continue
        ctx.progress(f"report section {sid}: {SECTION_TITLES[sid].lower()}")
        start = time.perf_counter()
        built.append(_run_builder(sid, ctx))
        seconds = time.perf_counter() - start
        if seconds >= 1:
            ctx.progress(f"report section {sid} took {seconds:.1f} s")
    recorded = {k: v for k, v in opts.items() if k not in _UNRECORDED_OPTIONS}
    recorded["lab"] = getattr(opts["lab"], "id", opts["lab"])
    return Report(model=_model_info(loaded), options=plain(recorded), sections=tuple(built),
                  created=datetime.now(UTC).isoformat(timespec="seconds"),
                  environment=_environment())


def check_sections(sections: Iterable[str] | None) -> list[str]:
    """The section ids asked for (all for None), once each; InspectorError names unknown ones.

    >>> check_sections(["summary", "summary"])
    ['summary']
    """
    wanted = list(SECTIONS) if sections is None else list(dict.fromkeys(sections))
    unknown = [s for s in wanted if s not in SECTION_TITLES]
    if unknown:
        raise InspectorError(f"unknown report section(s) {', '.join(map(repr, unknown))}; "
                             f"choose from {', '.join(SECTIONS)}")
    return wanted


def check_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """Every option with its default filled in; InspectorError names unknown options."""
    bad = sorted(set(options) - set(DEFAULT_OPTIONS))
    if bad:
        raise InspectorError(f"unknown report option(s) {', '.join(bad)}; known options: "
                             f"{', '.join(DEFAULT_OPTIONS)}")
    return {**DEFAULT_OPTIONS, **options}


def _run_builder(sid: str, ctx: Context) -> Section:
    title = SECTION_TITLES[sid]
    builder = _BUILDERS.get(sid)
    if builder is None:
        return Section(sid, title, "skipped", "this section has no builder in this installation")
    try:
        with kept_sharded(ctx.loaded.model):
            return builder(ctx)
    except SectionUnavailable as exc:
        return Section(sid, title, "skipped", str(exc))
    except InspectorError as exc:
        return Section(sid, title, "skipped", str(exc))
    except Exception as exc:  # noqa: BLE001 - one failed analysis must not lose the whole report
        message = f"{type(exc).__name__}: {exc}"
        return Section(sid, title, "error", message,
                       findings=(Finding("report-section-failed", "error", "",
                                         f"the {title.lower()} section failed: {message}"),))


def _model_info(loaded: Any) -> dict[str, Any]:
    return {"name": str(loaded.name), "source": str(loaded.source), "device": str(loaded.device),
            "dtype": loaded.dtype, "checkpoint": None if loaded.checkpoint is None else
            Path(loaded.checkpoint).name, "class": type(loaded.model).__name__}


def _environment() -> dict[str, Any]:
    import torch

    from . import __version__
    return {"inspector": __version__, "torch": torch.__version__.split("+")[0]}


# ------------------------------------------------------------------------- sections


@section_builder("summary")
def _summary_section(ctx: Context) -> Section:
    model_summary, summary_findings = need("summary", "model_summary", "summary_findings")
    s = model_summary(ctx.model)
    facts = {k: v for k, v in s.as_dict().items() if k != "bytes"}
    findings = [*ctx.loaded.findings, *summary_findings(s)]
    return Section("summary", SECTION_TITLES["summary"], facts=plain(facts),
                   tables=(Table.from_frame("Bytes by kind, dtype and device", s.bytes_table),),
                   findings=tuple(findings))


def _figure(ctx: Context, notes: list[str], module: str, name: str, title: str, *args: Any,
            summary: Table | pd.DataFrame | None = None, **kwargs: Any) -> tuple[ReportFigure, ...]:
    """``inspector.figures.<module>.<name>(*args)`` as a report figure; a note if it is missing."""
    try:
        fn = need(f"figures.{module}", name)
    except SectionUnavailable as exc:
        notes.append(f"figure {title!r} left out: {exc}")
        return ()
    return (make_figure(title, fn(*args, **kwargs), summary),)


@section_builder("aliases")
def _aliases_section(ctx: Context) -> Section:
    alias_analysis = need("aliases", "alias_analysis")
    with ctx.loaded.lock:
        analysis = alias_analysis(ctx.model)
    notes: list[str] = []
    facts = {"alias_groups": len(analysis.groups), "names": analysis.names,
             "unique_elements": analysis.unique_numel, "elements_with_aliases": analysis.numel_with_aliases,
             "identity_only": analysis.identity_only, "disjoint_views": len(analysis.disjoint)}
    tables = [Table.from_frame("Alias groups", analysis.to_frame(),
                               "names[0] is the name named_parameters() keeps")]
    if analysis.disjoint:
        tables.append(Table("Disjoint views of one storage (not aliases)", ("regions", "storage_bytes", "device"),
                            tuple((" | ".join(", ".join(r) for r in d.regions), d.storage_nbytes, d.device)
                                  for d in analysis.disjoint)))
    figures = _figure(ctx, notes, "aliases", "alias_graph_figure", "Alias graph", ctx.model,
                      list(analysis.groups), summary=tables[0])
    names = _conversions(ctx, notes)
    if names:
        conversion_table = need("aliases", "conversion_table")
        table, _results = conversion_table(ctx.model, names)
        tables.append(Table.from_frame(
            "Conversions (each run on a copy of the model)", table,
            "what each conversion does to every alias group; the model itself is not changed"))
        facts["conversions_checked"] = len(names)
    return Section("aliases", SECTION_TITLES["aliases"], note="; ".join(notes), facts=plain(facts),
                   tables=tuple(tables), figures=figures, findings=tuple(analysis.findings))


def _conversions(ctx: Context, notes: list[str]) -> list[str]:
    choice = ctx.options["conversions"]
    if not choice:
        return []
    known = list(need("aliases", "CONVERSIONS"))
    if choice == "all":
        return known
    if choice == "auto":
        size, limit = model_bytes(ctx.model), int(ctx.options["conversion_max_bytes"])
        if size > limit:
            notes.append(f"conversion checks left out: each copies the model ({size} bytes, more than "
                         f"conversion_max_bytes={limit}); pass conversions='all' or a list to run them")
            return []
        return known
    names = [choice] if isinstance(choice, str) else list(choice)
    bad = [n for n in names if n not in known]
    if bad:
        raise InspectorError(f"unknown conversion(s) {', '.join(bad)}; choose from {', '.join(known)}")
    return names


@section_builder("offsets")
def _offsets_section(ctx: Context) -> Section:
    offset_map, offset_findings = need("offsets", "offset_map", "offset_findings")
    notes: list[str] = []
    model = ctx.model
    table = offset_map(model)
    findings = list(offset_findings(model))
    facts: dict[str, Any] = {"tensors": len(table), "vector_length": int(table["end"].max()) if len(table) else 0}
    tables = [Table.from_frame("Flat offset map", table,
                               "rows in parameters() order: parameters_to_vector(...)[start:end] is each "
                               "tensor flattened")]
    trainable = None
    if any(not p.requires_grad for p in model.parameters()):
        trainable = offset_map(model, trainable_only=True)
        tables.append(Table.from_frame("Flat offset map of the trainable parameters only", trainable,
                                       "frozen parameters are left out, so later offsets move left"))
    grads = _gradients(ctx, notes)
    figures = _figure(ctx, notes, "offsets", "offset_strip", "Flat vector", table, trainable,
                      None if grads is None else grads.by_parameter, summary=tables[0])
    if grads is not None:
        tables.append(Table.from_frame("Gradient norms per parameter", grads.by_parameter))
        tables.append(Table.from_frame("Gradient norms per module", grads.by_module))
        facts.update({"total_gradient_norm": grads.total_norm, **{f"grad_{k}": v for k, v in grads.counts.items()}})
        findings += grads.findings
        figures += _figure(ctx, notes, "offsets", "layer_norm_bars", "Gradient norm per layer",
                           grads.by_module, summary=tables[-1])
    return Section("offsets", SECTION_TITLES["offsets"], note="; ".join(notes), facts=plain(facts),
                   tables=tuple(tables), figures=figures, findings=tuple(findings))


def _gradients(ctx: Context, notes: list[str]) -> Any:
    """Gradient norms from the ``gradients`` option, the model's ``.grad``, or one backward pass if asked.

    The backward pass for the report uses ``torch.autograd.grad``: no ``.grad`` is set.
    """
    gradient_report = need("offsets", "gradient_report")
    model = ctx.model
    given = ctx.options["gradients"]
    if not ctx.options["backward"]:
        if given:
            with ctx.loaded.lock:
                return gradient_report(model, grads=given)
        if given is None and any(p.grad is not None for p in model.parameters()):
            with ctx.loaded.lock:
                return gradient_report(model)
        notes.append("no gradients yet: gradient norms left out (pass backward=True for one backward pass)")
        return None
    loss_gradients = need("loss_gradients", "loss_gradients")
    result = loss_gradients(ctx.loaded, batch_size=int(ctx.options["batch_size"]))
    with ctx.loaded.lock:
        grads = gradient_report(model, grads=result.grads)
    notes.append(result.message)
    return grads


@section_builder("placement")
def _placement_section(ctx: Context) -> Section:
    placement_table, placement_findings = need("placement", "placement_table", "placement_findings")
    notes: list[str] = []
    model = ctx.model
    now = placement_table(model)
    findings = list(placement_findings(model))
    tables = [Table.from_frame("Where every parameter and buffer is now", now)]
    facts: dict[str, Any] = {"tensors": len(now),
                             "devices_now": sorted({str(d) for d in now["device"] if d is not None})}
    figures = _figure(ctx, notes, "placement", "placement_treemap", "Where every tensor is now", now,
                      summary=tables[0])
    budget = ctx.options["max_memory"]
    if budget is None:
        notes.append("no device budget given: the device-map plan is left out (pass max_memory, "
                     "e.g. '0=20GiB,1=20GiB,cpu=64GiB')")
    else:
        compare_with_accelerate, format_max_memory = need(
            "placement", "compare_with_accelerate", "format_max_memory")
        with ctx.loaded.lock, warnings.catch_warnings():
            # accelerate warns about its own plan's offloaded buffers; the diff table shows that
            warnings.filterwarnings("ignore", category=UserWarning, module="accelerate")
            comparison = compare_with_accelerate(model, budget)
        plan = comparison.ours
        facts.update({"budget": format_max_memory(plan.budget), "map_keys": len(plan.device_map),
                      "accelerate_check": "passed" if comparison.our_check is None else comparison.our_check,
                      "accelerate_infer_auto_device_map_check": "passed" if comparison.accelerate_check is None
                      else comparison.accelerate_check,
                      "accelerate_map_problems": len(comparison.accelerate_findings)})
        tables += [Table("Planned device map", ("key", "device"),
                         tuple((k, plain(v)) for k, v in plan.device_map.items())),
                   Table.from_frame("Bytes per device", plan.usage),
                   Table.from_frame("Audit of the plan: every parameter and buffer", plan.audit),
                   Table.from_frame("Planner decisions", plan.records_frame()),
                   Table.from_frame("Where accelerate's infer_auto_device_map differs, same budget",
                                    comparison.difference,
                                    "for comparison only: these are not findings about this model")]
        findings += plan.findings
        figures += _figure(ctx, notes, "placement", "placement_treemap", "Planned device map", plan.audit,
                           summary=tables[3])
        figures += _figure(ctx, notes, "placement", "usage_bars", "Bytes per device against the budget",
                           plan.usage, summary=tables[2])
    if "bytes_per_rank" in now.columns:  # DTensor parameters (FSDP2, tensor parallel)
        from .distributed.analyses import sharding_tables
        tables += [Table.from_frame(title, df) for title, df in sharding_tables(model, now)]
    return Section("placement", SECTION_TITLES["placement"], note="; ".join(notes), facts=plain(facts),
                   tables=tuple(tables), figures=figures, findings=tuple(findings))


@section_builder("captures")
def _captures_section(ctx: Context) -> Section:
    capture_activations = need("capture", "capture_activations")
    ctx.loaded.check_runnable()
    inputs = ctx.loaded.example_inputs(int(ctx.options["batch_size"]))
    caps = capture_activations(ctx.model, inputs, store_on="cpu",
                               max_bytes=ctx.options["capture_max_bytes"])
    notes: list[str] = []
    facts = {"captured": len(caps.outputs), "bytes": caps.total_bytes,
             "mutated": sorted(caps.mutated), "skipped": len(caps.skipped)}
    tables = [Table.from_frame("Captured outputs (detached copies)", caps.stats,
                               "statistics of each copy; mutated: the live output was changed in place "
                               "after the capture")]
    if caps.mutations:
        tables.append(Table("Outputs changed in place after capture",
                            ("module", "path", "overwritten_by", "detected_by", "max_abs_change"),
                            tuple((m.module, m.path, m.by, m.how, plain(m.max_abs_change))
                                  for m in caps.mutations)))
    if caps.skipped:
        tables.append(Table.from_frame("Not captured", caps.skipped_table))
    figures = _figure(ctx, notes, "capture", "capture_stats_figure", "Activation statistics", caps.stats,
                      summary=tables[0])
    return Section("captures", SECTION_TITLES["captures"], note="; ".join(notes), facts=plain(facts),
                   tables=tuple(tables), figures=figures, findings=tuple(caps.findings))


@section_builder("attribution")
def _attribution_section(ctx: Context) -> Section:
    ctx.loaded.check_runnable()
    opts = ctx.options
    limit = opts["attribution_cpu_max_bytes"]
    size = model_bytes(ctx.model)
    if limit is not None and ctx.loaded.input_device().type == "cpu" and size > int(limit):
        raise SectionUnavailable(
            f"attribution left out: the model has {size} bytes on the CPU, more than "
            f"attribution_cpu_max_bytes={int(limit)}; Integrated Gradients runs about 50 forward and "
            "backward passes of it. Load it on a GPU, or pass attribution_cpu_max_bytes=None "
            "(and perhaps a small attribution_steps) to run it here.")
    attribute, methods_for, methods = need("attribution", "attribute", "methods_for", "METHODS")
    inputs = ctx.loaded.example_inputs(1)
    method = opts["attribution_method"] or methods_for(ctx.loaded, inputs)[0]
    extra = {}
    if opts["attribution_steps"] is not None and method in methods and methods[method].has_delta:
        extra["n_steps"] = int(opts["attribution_steps"])
    result = attribute(ctx.loaded, inputs, method, opts["attribution_target"], opts["attribution_layer"],
                       **extra)
    notes: list[str] = []
    facts: dict[str, Any] = {"method": result.method, "captum_method": result.captum_method,
                             "target": result.target, "position": result.position, "layer": result.layer}
    comp = result.completeness()
    if comp is not None:
        facts.update({"max_abs_delta": comp.max_abs_delta, "max_relative_delta": comp.max_relative,
                      "trusted": comp.trusted})
    tables = [Table.from_frame("Attribution scores", result.summary)]
    figures: tuple[ReportFigure, ...] = ()
    if result.token_model:
        figures = _figure(ctx, notes, "attribution", "token_heatmap", "Attribution per token", result,
                          summary=tables[0])
    elif result.pixel_map() is not None:
        figures = _figure(ctx, notes, "attribution", "image_overlay", "Attribution over the input", result,
                          summary=tables[0])
    else:
        figures = _figure(ctx, notes, "attribution", "conductance_bars", "Attribution per unit", result,
                          summary=tables[0])
    try:
        notes.append(need("figures.attribution", "completeness_line")(result))
    except SectionUnavailable:
        pass
    return Section("attribution", SECTION_TITLES["attribution"], note=" ".join(notes), facts=plain(facts),
                   tables=tuple(tables), figures=figures, findings=tuple(result.findings))


@section_builder("labs")
def _labs_section(ctx: Context) -> Section:
    lab = ctx.options["lab"]
    if lab is None:
        raise SectionUnavailable("no lab results: the Labs page (or lab=..., lab_progress=...) adds them")
    get_lab, lab_section = need("labs", "get_lab"), need("labs.records", "lab_section")
    if isinstance(lab, str):
        lab = get_lab(lab)
    return lab_section(lab, ctx.options["lab_progress"] or {}, ctx.options["student"] or "")


# ------------------------------------------------------------------------- rendering


def _environment_jinja():
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["cell"] = display_value
    return env


def display_value(value: Any) -> str:
    """How a table cell reads for people: lists joined by commas, None as empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
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


def render_html(report: Report) -> str:
    """The report as one offline HTML file; every name passes through jinja2's autoescape."""
    import markupsafe
    from plotly.offline import get_plotlyjs

    figures = []
    for s in report.sections:
        for i, f in enumerate(s.figures):
            figures.append({"id": f"fig-{s.id}-{i}", "data": f.figure.get("data", []),
                            "layout": f.figure.get("layout", {})})
    template = _environment_jinja().get_template("report.html.j2")
    return template.render(
        report=report, findings=report.findings, titles=SECTION_TITLES,
        figure_count=len(figures),
        plotlyjs=markupsafe.Markup(get_plotlyjs()) if figures else "",
        figures_json=markupsafe.Markup(_script_json(figures)),
    )


def _md(value: Any) -> str:
    """A value as literal Markdown text: no link, image, markup or table break survives."""
    return markdown_text(display_value(value))


def _md_table(table: Table, max_rows: int) -> list[str]:
    if not table.columns:
        return []
    lines = ["| " + " | ".join(_md(c) for c in table.columns) + " |",
             "|" + "|".join(" --- " for _ in table.columns) + "|"]
    for row in table.rows[:max_rows]:
        lines.append("| " + " | ".join(_md(v) for v in row) + " |")
    if len(table.rows) > max_rows:
        lines.append("")
        lines.append(f"_{len(table.rows) - max_rows} more rows in the JSON or HTML report._")
    return lines


def render_markdown(report: Report) -> str:
    """The report as Markdown: one heading per section, pipe tables, figures as tables."""
    max_rows = int(report.options.get("max_rows") or DEFAULT_OPTIONS["max_rows"])
    m = report.model
    out = [f"# Model report: {_md(m.get('name'))}", "",
           f"Source {_md(m.get('source'))} on {_md(m.get('device'))}"
           + (f", dtype {_md(m.get('dtype'))}" if m.get("dtype") else "")
           + (f", checkpoint {_md(m.get('checkpoint'))}" if m.get("checkpoint") else "")
           + f". Created {_md(report.created)}; schema {_md(report.schema_version)}.", ""]
    for s in report.sections:
        out += [f"## {_md(s.title)}", ""]
        if s.id == "findings":
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
            out += ([_md(f.summary.note), ""] if f.summary.note else []) + _md_table(f.summary, max_rows) + [""]
    return "\n".join(out).rstrip() + "\n"


def render_pdf(report: Report, path: str | os.PathLike, chromium: str = CHROMIUM,
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
        page.write_text(report.to_html(), encoding="utf-8")
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
