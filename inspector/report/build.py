"""``build_report``: run the section functions on a loaded model and keep what they return.

A section whose analysis is not installed, or that cannot run on this model (a forward pass
on the meta device), is kept with ``status`` ``"skipped"`` and a note saying why; a section
that fails is kept with ``status`` ``"error"`` and an error finding. The report never stops there.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from ..labs import Lab, TaskRecord, lab_results
from ..utils.budget import check_budget
from ..utils.checks import require_loaded
from ..utils.dtensors import kept_sharded
from ..utils.findings import Finding, InspectorError
from ..utils.program import VERSION
from .data import Section, plain
from .model import Report
from .options import SECTION_TITLES, SECTIONS, UNRECORDED_OPTIONS, check_options, check_sections
from .sections import SECTION_BUILDERS, Context, SectionUnavailable, lab_section
from .sections.context import Progress


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

    >>> from inspector.loading.models import load_model
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
        check_budget()
        if sid == "findings":
            built.append(Section("findings", SECTION_TITLES["findings"]))
            continue
        ctx.progress(f"report section {sid}: {SECTION_TITLES[sid].lower()}")
        start = time.perf_counter()
        built.append(run_section(sid, ctx))
        seconds = time.perf_counter() - start
        if seconds >= 1:
            ctx.progress(f"report section {sid} took {seconds:.1f} s")
    recorded = {k: v for k, v in opts.items() if k not in UNRECORDED_OPTIONS}
    recorded["lab"] = getattr(opts["lab"], "id", opts["lab"])
    return Report(model=_model_info(loaded), options=plain(recorded), sections=tuple(built),
                  created=datetime.now(UTC).isoformat(timespec="seconds"),
                  environment=_environment())


def run_section(sid: str, ctx: Context) -> Section:
    """Section ``sid`` built by its function; skipped (with the reason) or an error section if it cannot
    be."""
    title = SECTION_TITLES[sid]
    builder = SECTION_BUILDERS.get(sid)
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


def lab_report(lab: Lab, progress: Mapping[str, Mapping[str, TaskRecord]], loaded: Any,
               student: str = "") -> Report:
    """A report of the lab's model (summary) with the lab results.

    Render it with ``.to_markdown()``, ``.to_html()`` or ``.to_json()``.
    """
    report = build_report(loaded, ["summary"])
    return replace(report, sections=(*report.sections, lab_section(lab_results(lab, progress, student))))


def _model_info(loaded: Any) -> dict[str, Any]:
    return {"name": str(loaded.name), "source": str(loaded.source), "device": str(loaded.device),
            "dtype": loaded.dtype, "checkpoint": None if loaded.checkpoint is None else
            Path(loaded.checkpoint).name, "class": type(loaded.model).__name__}


def _environment() -> dict[str, Any]:
    return {"inspector": VERSION, "torch": torch.__version__.split("+")[0]}
