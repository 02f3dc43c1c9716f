"""The Flatten map page's sections: the offset strip, both offset maps, gradient norms, the round trip."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from inspector import GradientNorms, InspectorError, LoadedModel, format_count
from inspector.figures import layer_norm_bars, offset_strip
from inspector.offsets import display_table, flatten_roundtrip
from inspector.utils import markdown_text
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.tables import paged_table

ROUNDTRIP_MAX = 20_000_000  # elements; the round trip holds two extra copies of the parameters


def flat_vector(full: pd.DataFrame, trainable: pd.DataFrame, report: GradientNorms | None) -> None:
    """The offset strip of both vectors."""
    st.subheader("The flat vector")
    with guarded("drawing the offset strip"):
        norms = (
            report.by_parameter
            if report is not None and report.counts["ok"] + report.counts["nonfinite"]
            else None
        )
        st.plotly_chart(offset_strip(full, trainable, norms), width="stretch", key="offsets_strip")
        st.caption("Top row: `parameters_to_vector(model.parameters())`; bottom row: a vector of trainable "
                   "parameters only. Each frozen segment in the top row is a hole the bottom row closes, so "
                   "every trainable segment after it starts earlier. Hover a segment for its name, shape and "
                   "range; on big models neighbouring tensors are merged into one mark.")


def side_by_side(full: pd.DataFrame, trainable: pd.DataFrame) -> None:
    """Both offset maps as tables."""
    st.subheader("Offset maps side by side")
    show = ["name", "start", "end", "numel", "shape", "requires_grad", "aliases", "dtype", "device", "kind"]
    left, right = st.columns(2)
    with left:
        st.markdown("**`parameters_to_vector(model.parameters())`** — frozen rows are the holes")
        paged_table(display_table(full)[show], "offsets_full")
    with right:
        st.markdown("**Trainable only** — `[p for p in model.parameters() if p.requires_grad]`")
        paged_table(display_table(trainable)[show], "offsets_trainable")


def gradient_norms_section(report: GradientNorms | None) -> None:
    """Whole-model and per-layer norms, per parameter and per module."""
    st.subheader("Gradient norms")
    if report is None:
        st.info("No gradients on the meta device.")
    else:
        counts = report.counts
        cols = st.columns(5)
        cols[0].metric(
            "Whole-model norm", "—" if math.isnan(report.total_norm) else f"{report.total_norm:.4g}"
        )
        cols[1].metric("ok", counts["ok"])
        cols[2].metric("no gradient", counts["none"], help="trainable, but the loss did not reach it")
        cols[3].metric("frozen", counts["frozen"])
        cols[4].metric("NaN / Inf", counts["nonfinite"])
        with guarded("drawing per-layer norms"):
            top_k = st.slider("Layers shown", 5, 50, 15, key="offsets_top_k")
            st.plotly_chart(
                layer_norm_bars(report.by_module, top_k=top_k), width="stretch", key="offsets_bars"
            )
        tab_p, tab_m = st.tabs(["Per parameter", "Per module"])
        with tab_p:
            paged_table(report.by_parameter, "offsets_norms")
        with tab_m:
            paged_table(report.by_module, "offsets_module_norms",
                        caption="a module's norm covers every parameter below it; (model) is the whole model")


def roundtrip_section(loaded: LoadedModel, total: int) -> None:
    """What parameters_to_vector and vector_to_parameters do, on copies of the parameters."""
    st.subheader("Round trip: parameters_to_vector → vector_to_parameters")
    st.caption("Run on copies of the parameters, never on the model. It shows what the vector is, rather "
               "than saying it.")
    with guarded("running the round trip"):
        try:
            if total > ROUNDTRIP_MAX:
                raise InspectorError(
                    f"{loaded.name} has {format_count(total)} parameter elements; the round trip "
                    f"copies the parameters twice, so this page runs it on models up to "
                    f"{format_count(ROUNDTRIP_MAX)}. Pick a smaller model in the sidebar to see it."
                )
            rt = cached_analysis(flatten_roundtrip, loaded.model, max_elements=ROUNDTRIP_MAX)
        except InspectorError as exc:
            st.info(markdown_text(exc))
        else:
            cols = st.columns(4)
            cols[0].metric("Vector shares memory", "yes" if rt.shares_memory else "no",
                           help="Does the vector share memory with the parameters?")
            cols[1].metric("Writes reach parameters", "yes" if rt.write_through else "no",
                           help="Does writing into the vector change a parameter?")
            cols[2].metric("Restored exactly", "yes" if rt.restored_exactly else "no",
                           help="Does vector_to_parameters give back every value bit for bit?")
            cols[3].metric("Views afterwards", "yes" if rt.views_after else "no",
                           help="Are the parameters views of the vector after vector_to_parameters?")
            st.markdown("\n".join(f"{i}. {markdown_text(step)}" for i, step in enumerate(rt.steps, 1)))
            if rt.error:
                st.warning(f"parameters_to_vector failed on this model: {markdown_text(rt.error)}")
