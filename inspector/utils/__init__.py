"""The floor every layer stands on: small helpers that import nothing else of the library.

- :mod:`.findings`: :class:`Finding` and :class:`InspectorError`, the one currency of problems;
- :mod:`.budget`: :func:`work_budget` and :func:`check_budget`, a wall budget long loops check between chunks;
- :mod:`.codes`: every finding code, its severity, meaning, what to do and whether it recurs;
- :mod:`.norms`: :func:`grouped_norms`, the one fused L2 norm per (device, dtype) group;
- :mod:`.labels`: the one label of the root module, ``(model)``, and of the batch, ``(batch)``, and
  :func:`natural_key`, the order of names that reads their numbers as numbers;
- :mod:`.units` and :mod:`.sizes`: bytes and counts for people, and sizes people write;
- :mod:`.escaping`: names from a model or a file shown as data (terminal, Markdown, plotly, grids,
  TensorBoard);
- :mod:`.paths`: :func:`confined`, the one gate of every path from people, and :func:`regular_file`
  (a FIFO or a device is refused before it is opened);
- :mod:`.dtensors`: DTensor facts (local pieces, placements, meshes, replicas); plain tensors pass;
- :mod:`.wrappers` and :mod:`.checks`: see through ``torch.compile``/DDP/FSDP wrappers, check arguments;
- :mod:`.forward_state`, :mod:`.torch_state`, :mod:`.locks`: put back what a forward or a model
  file changed, one lock per model;
- :mod:`.process_memory`, :mod:`.program`: resident memory, the command line's name, how to install
  an optional extra (:func:`install_hint`).
"""

from __future__ import annotations

from .budget import WorkStopped, check_budget, work_budget
from .codes import CODES, FindingCode, finding_code, recurs
from .escaping import (
    grid_frame,
    grid_text,
    markdown_code,
    markdown_text,
    plot_text,
    tensorboard_text,
    terminal_line,
    terminal_text,
    visible_text,
)
from .findings import (
    Episodes,
    Finding,
    InspectorError,
    episode_starts,
    first_line,
    group_findings,
    sort_findings,
)
from .labels import BATCH_LABEL, LOSS_LABEL, ROOT_LABEL, module_label, natural_key
from .norms import grouped_norms
from .paths import Kind, confined, file_kind, regular_file
from .program import EXTRAS, install_hint
from .sizes import parse_size
from .units import format_budget, format_bytes, format_count, format_number, progress_text

__all__ = ["BATCH_LABEL", "CODES", "EXTRAS", "LOSS_LABEL", "Episodes", "Finding", "FindingCode",
           "InspectorError", "Kind", "ROOT_LABEL",
           "episode_starts", "finding_code", "first_line", "module_label", "natural_key", "recurs",
           "format_budget", "format_bytes", "format_count", "grouped_norms",
           "format_number", "group_findings", "markdown_code", "markdown_text", "parse_size", "plot_text",
           "progress_text", "sort_findings", "terminal_text", "visible_text", "grid_frame", "grid_text",
           "tensorboard_text", "terminal_line", "confined", "file_kind", "regular_file", "install_hint",
           "WorkStopped", "check_budget", "work_budget"]
