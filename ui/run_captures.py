"""The stored inputs and outputs of a watched run's first NaN/Inf producer (Hook captures page)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from inspector.figures import capture_heatmap, capture_histogram
from inspector.watching import producer_of, read_captures
from ui.errors import guarded
from ui.runs import checked_path
from ui.tables import paged_table

STATS_ORDER = ("module", "kind", "shape", "dtype", "nan", "inf", "min", "max", "mean", "std", "zero_fraction",
               "bytes", "device", "path", "mutated")


def stats_layout(stats: pd.DataFrame) -> dict[str, Any]:
    """Table settings for a capture's stats: NaN and Inf counts up front (the reason to look), values to
    four significant digits (never ``-0.0000000006``), the zero fraction as a percentage, and an
    all-empty ``path`` left out."""
    value = {c: st.column_config.NumberColumn(format="%.4g") for c in ("min", "max", "mean", "std")}
    counts = {"nan": st.column_config.NumberColumn("NaN", format="%d"),
              "inf": st.column_config.NumberColumn("Inf", format="%d"),
              "zero_fraction": st.column_config.NumberColumn("zeros", format="percent")}
    empty = {c for c in ("path",) if c in stats.columns and not stats[c].astype(str).str.strip().any()}
    order = [c for c in STATS_ORDER if c in stats.columns] + [
        c for c in stats.columns if c not in STATS_ORDER
    ]
    return {"column_order": [c for c in order if c not in empty],
            "column_config": {c: v for c, v in {**value, **counts}.items() if c in stats.columns}}


def run_captures_section() -> None:
    """An expander: give a run file written by ``watch(..., nonfinite=True)``, see its producer's copies."""
    with st.expander("Captures of a watched run (the first module that produced NaN/Inf)"):
        path = st.text_input(
            "Run file",
            key="cap_run_path",
            placeholder="run.inspect",
            help="Written by watch(model, optimizer, path, nonfinite=True) or "
            "`python -m inspector watch ... --nonfinite`, under the runs folders of "
            "`model-inspector serve --runs DIR`; its captures file lies next to it",
        )
        if not path.strip():
            return
        with guarded("reading the run's captures"):
            caps = read_captures(checked_path(path))  # only under the runs folders or this session's uploads
            if caps is None:
                st.info("This run stored no captures: no module produced NaN/Inf, or it ran without "
                        "`nonfinite=True`.")
                return
            name, step, rank = producer_of(caps)
            st.markdown(
                f"Inputs and outputs of **`{name}`** at step **{step}**{f' on rank {rank}' if rank else ''}, "
                "copied when it first produced NaN/Inf from finite inputs."
            )
            paged_table(caps.stats, key="cap_run_stats", **stats_layout(caps.stats))
            if caps.skipped:
                paged_table(caps.skipped_table, key="cap_run_skipped")
            if isinstance(caps.outputs[name], tuple) and not caps.outputs[name]:
                st.caption("No output tensor was stored (the capture byte budget left it out).")
                return
            left, right = st.columns(2)
            left.plotly_chart(capture_histogram(caps.outputs[name], title=f"{name}: output values"),
                              key="cap_run_hist")
            right.plotly_chart(capture_heatmap(caps.outputs[name], title=f"{name}: output, 2-D slice"),
                               key="cap_run_heatmap")
