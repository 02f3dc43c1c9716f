"""One function per report section, each ``(Context) -> Section``, in report order.

``build_report`` calls ``SECTION_BUILDERS[section_id]``; the ``findings`` section has no
function (the report lists every other section's findings there).

Modules: ``aliases``: the aliases section; ``attribution``: the attribution section; ``captures``: the
captures section; ``compare``: the compare section; ``context``: what every section function gets and
how one says it cannot run here; ``labs``: the labs section; ``offsets``: the offsets section;
``placement``: the placement section; ``summary``: the summary section.
"""

from __future__ import annotations

from .aliases import aliases_section
from .attribution import attribution_section
from .captures import captures_section
from .compare import compare_section
from .context import Context, SectionBuilder, SectionUnavailable
from .labs import lab_section, labs_section
from .offsets import offsets_section
from .placement import placement_section
from .summary import summary_section

SECTION_BUILDERS: dict[str, SectionBuilder] = {
    "summary": summary_section,
    "aliases": aliases_section,
    "offsets": offsets_section,
    "placement": placement_section,
    "captures": captures_section,
    "attribution": attribution_section,
    "labs": labs_section,
    "compare": compare_section,
}

__all__ = ["SECTION_BUILDERS", "Context", "SectionBuilder", "SectionUnavailable", "aliases_section",
           "attribution_section", "captures_section", "lab_section", "labs_section", "offsets_section",
           "placement_section", "summary_section",
           "compare_section"]
