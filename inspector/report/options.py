"""The sections a report can hold and the options ``build_report`` understands."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..utils.findings import InspectorError

SECTION_TITLES: dict[str, str] = {
    "findings": "Findings",
    "summary": "Summary",
    "aliases": "Alias groups and conversions",
    "offsets": "Flat offsets and gradient norms",
    "placement": "Device map: plan and audit",
    "captures": "Activation captures",
    "attribution": "Attributions",
    "labs": "Lab results",
    "compare": "Compared with another model or checkpoint",
}
SECTIONS: tuple[str, ...] = tuple(SECTION_TITLES)

#: Options ``build_report`` understands, with their defaults; every report records them all.
DEFAULT_OPTIONS: dict[str, Any] = {
    "batch_size": 1,  # example inputs for captures and backward passes
    "backward": False,  # one backward pass for gradient norms (earlier .grad restored after)
    "conversions": "auto",  # conversion checks: "auto", "all", a list of names, or [] for none
    "conversion_max_bytes": 64 << 20,  # "auto" runs every conversion only on models up to this size
    "max_memory": None,  # device budget for the plan, e.g. "0=20GiB,cpu=64GiB" (None: no plan)
    "capture_max_bytes": 256 << 20,  # byte budget of the activation captures
    "attribution_method": None,  # None: the first method that fits the model
    "attribution_target": 0,  # class index or next-token id attributed
    "attribution_layer": None,  # layer for layer methods (None: the method's default)
    "attribution_steps": None,  # n_steps of integrating methods (None: captum's default, 50)
    "attribution_cpu_max_bytes": 64 << 20,  # on a CPU, attribute only models up to this size (None: any)
    "lab": None,  # a lab id (or Lab) whose results go into the labs section
    "lab_progress": None,  # {lab id: {task id: TaskRecord}} from a labs session (not recorded)
    "gradients": None,  # {parameter name: gradient} to report instead of .grad (not recorded)
    "student": "",
    "max_rows": 60,  # rows per table in Markdown (JSON and HTML keep every row)
    "compare_with": None,  # B for the compare section: a source, checkpoint file or folder (None: skipped)
    "controls": None,  # {option: how this reader turns it on} (not recorded); see how_to
}
UNRECORDED_OPTIONS = ("lab_progress", "gradients", "controls")

#: How a caller of ``build_report`` turns each option on; the CLI and the dashboard pass their own words
#: (their flags, their controls) in the ``controls`` option, so a report speaks to the one who made it.
PYTHON_CONTROLS: dict[str, str] = {
    "backward": "pass backward=True for one backward pass",
    "conversions": "pass conversions='all' to run them",
    "attribution_cpu_max_bytes": (
        "pass attribution_cpu_max_bytes=None (and perhaps a small attribution_steps) to run it here"
    ),
    "lab": "the Labs page (or lab=..., lab_progress=...) adds them",
    "compare_with": "pass compare_with=<a source, checkpoint file or folder>",
}


def how_to(options: Mapping[str, Any], option: str) -> str:
    """The words that tell this report's reader how to turn ``option`` on.

    >>> how_to({"controls": {"backward": "tick Backward"}}, "backward"), how_to({}, "lab")[:13]
    ('tick Backward', 'the Labs page')
    """
    return {**PYTHON_CONTROLS, **(options.get("controls") or {})}[option]


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
