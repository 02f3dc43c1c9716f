"""Model Inspector: home page."""

from __future__ import annotations

import streamlit as st

from inspector.findings import sort_findings
from inspector.summary import format_bytes, model_summary, summary_findings
from ui.errors import guarded
from ui.sidebar import model_picker

st.set_page_config(page_title="Model Inspector", page_icon="🔎", layout="wide")
st.title("Model Inspector")
st.markdown(
    "Debug PyTorch models where training or multi-GPU inference goes silently wrong: "
    "which parameters are really one tensor, where each sits in the flat vector, which device "
    "holds every parameter and buffer, and what each layer really output. "
    "Pick a model in the sidebar, then open a view.")

loaded = model_picker()
if loaded is not None:
    with guarded("summarising the model"):
        s = model_summary(loaded.model)
        cols = st.columns(5)
        cols[0].metric("Modules", s.modules)
        cols[1].metric("Parameter elements", f"{s.parameter_elements:,}",
                       help="Each Parameter object once, as parameters() yields them")
        cols[2].metric("Counting aliases", f"{s.parameter_elements_with_aliases:,}",
                       delta=f"+{s.aliased_elements:,} aliased" if s.aliased_elements else None,
                       delta_color="off")
        cols[3].metric("Trainable / frozen", f"{s.trainable_elements:,} / {s.frozen_elements:,}")
        cols[4].metric("Buffers", f"{s.buffers} ({s.buffer_elements:,} elements)")
        st.subheader("Bytes by dtype and device")
        st.dataframe(s.bytes_table.assign(size=s.bytes_table["bytes"].map(format_bytes)),
                     hide_index=True)
        st.subheader("Findings")
        findings = sort_findings(loaded.findings + summary_findings(s))
        if not findings:
            st.success("Nothing found while loading.")
        st.dataframe([f.to_dict() for f in findings], hide_index=True) if findings else None
