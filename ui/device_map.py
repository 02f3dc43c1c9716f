"""The Device map page's sections: both maps side by side, the actual placement, a pasted map's audit."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from inspector import Comparison, LoadedModel, placement_findings, placement_table
from inspector.figures import key_label, usage_bars, usage_side_by_side
from inspector.placement import audit, device_usage, load_device_map, missing_devices, try_dispatch
from inspector.utils import markdown_code, markdown_text
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.tables import findings_table, paged_table, show_frame


def map_frame(device_map: dict) -> pd.DataFrame:
    """A device map as a table; accelerate's key "" (the model itself) reads "(whole model)"."""
    return pd.DataFrame(
        {"key": [key_label(k) for k in device_map], "device": [str(v) for v in device_map.values()]}
    )


def side_by_side(comparison: Comparison) -> None:
    """Both maps as tables, their usage, and the tensors they place differently."""
    ours = comparison.ours
    st.subheader("Our plan and accelerate's, side by side")
    a, b = st.columns(2)
    a.markdown("**plan_device_map**")
    with a:
        show_frame(map_frame(ours.device_map), height=260)
    b.markdown("**accelerate.infer_auto_device_map**")
    with b:
        show_frame(map_frame(comparison.accelerate_map), height=260)
    st.plotly_chart(usage_side_by_side(ours.usage, comparison.accelerate_usage), key="dm_side_by_side")
    if len(comparison.difference):
        st.markdown(f"**{len(comparison.difference)} tensors placed differently or flagged differently**")
        paged_table(comparison.difference.astype(str), "dm_difference")
    elif not comparison.accelerate_error:
        st.success("The two maps place every tensor alike.")


def actual_placement(loaded: LoadedModel, comparison: Comparison) -> None:
    """Where the tensors are now, and dispatching a copy by our plan."""
    model = loaded.model
    ours = comparison.ours
    with guarded("reading where the tensors are"):
        actual = cached_analysis(placement_table, model)
        st.caption(
            f"{markdown_text(loaded.name)} as loaded on {markdown_code(loaded.device)}: one row per "
            "parameter and buffer name."
        )
        findings_table(cached_analysis(placement_findings, model), "dm_findings_actual",
                       empty="Every tensor sits with its module's parameters.")
        paged_table(actual.astype({"device": str, "module_primary_device": str}), "dm_actual")
    local = not missing_devices(ours.device_map)
    st.markdown(
        "**Try the plan**: dispatch a copy with accelerate and compare outputs with the loaded model."
    )
    why_not = (
        "The model is on the meta device: it has no weights to dispatch. Load it on cpu or a GPU."
        if loaded.is_meta
        else None
        if local
        else "This plan uses devices this server does not have ("
        + ", ".join(f"GPU {d}" if isinstance(d, int) else str(d) for d in missing_devices(ours.device_map))
        + "): to try it here, give a budget for cpu and disk only (e.g. cpu=1GiB,disk=100GiB)."
    )
    if why_not:
        st.info(why_not)
    if st.button("Dispatch a copy", key="dm_dispatch", disabled=why_not is not None, help=why_not):
        with guarded("dispatching a copy"), st.spinner("Dispatching…"):
            check = try_dispatch(loaded, ours.device_map)
            (st.success if check.outputs_equal else st.warning)(markdown_text(check.message))
            findings_table(
                check.findings, "dm_dispatch_findings", empty="Every tensor is where the plan says."
            )
            paged_table(
                check.table.astype({"device": str, "module_primary_device": str}), "dm_dispatch_table"
            )


def audit_a_map(loaded: LoadedModel, budget: dict) -> None:
    """Audit a device map pasted as JSON."""
    model = loaded.model
    hf_map = getattr(model, "hf_device_map", None)
    text = st.text_area("A device map as JSON (e.g. a model's hf_device_map)", key=f"dm_json_{loaded.source}",
                        value=json.dumps(hf_map, default=str) if isinstance(hf_map, dict) else '{"": "cpu"}',
                        height=120, help="Prefilled with the loaded model's hf_device_map when it has one")
    with guarded("auditing the map"):
        result = audit(model, load_device_map(text, "the JSON map"))
        findings_table(result.findings, "dm_json_findings", empty="This map places every tensor.")
        st.plotly_chart(usage_bars(device_usage(result.table, budget), "this map"), key="dm_json_usage")
        paged_table(result.table.astype({"device": str, "module_primary_device": str}), "dm_json_table")
