"""The runs folders on the Training and Compare pages: the runs found there (newest first, live
ones marked, each with its first finding), picked by name; every typed run path checked against
them; and several runs overlaid on the loss and gradient-norm lines."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import streamlit as st

from inspector.figures import runs_overlay_figure
from inspector.runfolders import RunEntry, allowed_run_path, describe, list_runs, runs_dirs
from inspector.utils import InspectorError, grid_frame, markdown_text
from inspector.watching import main_steps, read_run
from ui.errors import guarded
from ui.uploads import session_uploads

LIST_TTL_S = 3


def checked_path(typed: str) -> str:
    """A typed run path (or ``?run=``) resolved, when it lies under a runs folder or this browser
    session's own upload folder (never another session's); otherwise :class:`InspectorError` naming
    ``--runs``."""
    return str(allowed_run_path(typed, runs_dirs(), extra=[session_uploads().folder]))


@st.cache_data(ttl=LIST_TTL_S, show_spinner=False)
def _entries(dirs: tuple[str, ...]) -> list[RunEntry]:
    return list_runs([Path(d) for d in dirs])


@st.cache_data(show_spinner=False, max_entries=1024)
def _row(_entry: RunEntry, path: str, size: int, modified: float, live: bool) -> dict[str, object]:
    return describe(_entry)


def folder_runs() -> list[RunEntry]:
    """The runs under the runs folders; a folder gone since the server started shows its message and
    lists nothing, and the page goes on."""
    dirs = runs_dirs()
    if not dirs:
        return []
    try:
        return _entries(tuple(str(d) for d in dirs))
    except InspectorError as exc:
        st.error(markdown_text(str(exc)))
        return []


def pick_from_folders(key: str, label: str = "A run from the runs folders", col=st) -> str | None:
    """The path of the run picked by name, or None; a table of every run above the choice."""
    dirs = runs_dirs()
    if not dirs:
        col.caption("Start the server with `model-inspector serve --runs DIR[,DIR...]` (or set "
                    "`INSPECTOR_RUNS`) to list the runs of those folders here.")
        return None
    entries = folder_runs()
    if not entries:
        col.info(markdown_text(f"No run files under {', '.join(str(d) for d in dirs)} yet."))
        return None
    rows = pd.DataFrame([_row(e, str(e.path), e.size, e.modified, e.live) for e in entries])
    with col.expander(f"{len(entries)} run(s) in the runs folders, newest first", expanded=False):
        st.dataframe(grid_frame(rows), hide_index=True, width="stretch")
    by_name = {e.name: e for e in entries}
    choice = col.selectbox(label, list(by_name), index=None, key=key, placeholder="a run by name…",
                           format_func=lambda n: by_name[n].label if n in by_name else n)
    return str(by_name[choice].path) if choice in by_name else None


def overlay_runs(key: str) -> None:
    """Two or more runs of the runs folders on one loss / gradient-norm figure."""
    entries = {e.name: e for e in folder_runs()}
    if len(entries) < 2:
        return
    st.subheader("Runs side by side")
    names = st.multiselect("Overlay runs on the loss and gradient-norm lines", list(entries), key=key,
                           max_selections=10, placeholder="two or more runs…")
    if len(names) < 2:
        st.caption("Pick two or more runs to draw them on one pair of lines.")
        return
    with guarded("overlaying runs"):
        lines = {n: main_steps(read_run(entries[n].path)) for n in names}
        st.plotly_chart(runs_overlay_figure(lines), width="stretch", key=f"{key}_chart")
