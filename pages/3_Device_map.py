"""Device map: plan where every parameter and buffer goes, side by side with accelerate's plan."""

from __future__ import annotations

import json

import pandas as pd
import streamlit as st

from inspector import (
    Comparison,
    LoadedModel,
    compare_with_accelerate,
    format_bytes,
    parse_max_memory,
    placement_findings,
    placement_table,
)
from inspector.figures import key_label, placement_treemap, usage_bars, usage_side_by_side
from inspector.placement import (
    audit,
    device_usage,
    format_max_memory,
    load_device_map,
    missing_devices,
    suggest_budget,
    try_dispatch,
)
from inspector.utils import markdown_code, markdown_text
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.sidebar import model_picker
from ui.tables import findings_table, paged_table, show_frame


def budget_text(n: int) -> str:
    """A budget as the editor shows it and reads back: ``144.52GiB`` (binary units, no space)."""
    return format_bytes(n, 2).replace(" ", "")


def map_frame(device_map: dict) -> pd.DataFrame:
    """A device map as a table; accelerate's key "" (the model itself) reads "(whole model)"."""
    return pd.DataFrame(
        {"key": [key_label(k) for k in device_map], "device": [str(v) for v in device_map.values()]}
    )


def _header() -> LoadedModel | None:
    """Title, explanation and the loaded model (None when there is none)."""
    loaded = model_picker()

    st.title("Device map")
    st.caption(
        "accelerate's `infer_auto_device_map` fills devices greedily and splits a module that does not "
        "fit. When that module owns buffers directly (a scale vector, a position table, running "
        "statistics) the map simply lacks them: `dispatch_model` leaves them where they were and the "
        "forward pass mixes devices. Here every parameter **and every buffer** gets a device, and both "
        "plans are audited tensor by tensor. Planning is arithmetic: GPUs you do not have are fine."
    )

    if loaded is None:
        st.info("Load a model in the sidebar to plan its device map.")
    return loaded


def _budget_inputs(loaded: LoadedModel):
    """The budget editor and the classes never to split; returns both and the right-hand column."""
    model = loaded.model
    st.subheader("Budget per device")
    st.caption(
        "Devices: a GPU index (0, 1, …), `mps`, `cpu` or `disk`. Sizes: bytes or with a unit (20GiB, 500MB)."
    )
    budget_rows = pd.DataFrame(
        [(str(d), budget_text(n)) for d, n in cached_analysis(suggest_budget, model).items()],
        columns=["device", "budget"],
    )
    left, right = st.columns([2, 3])
    with left:
        edited = st.data_editor(
            budget_rows,
            num_rows="dynamic",
            hide_index=True,
            key=f"dm_budget_{loaded.source}",
            column_config={
                "device": st.column_config.TextColumn(required=True),
                "budget": st.column_config.TextColumn(required=True),
            },
        )
    with right:
        classes = sorted({type(m).__name__ for m in model.modules()})
        default = [c for c in (getattr(model, "_no_split_modules", None) or []) if c in classes]
        no_split = st.multiselect("Never split these module classes", classes, default=default,
                                  key=f"dm_no_split_{loaded.source}",
                                  help="Defaults to the model's _no_split_modules")
    return edited, no_split, right


def _plan(loaded: LoadedModel, edited: pd.DataFrame, no_split: list, right) -> tuple[Comparison, dict] | None:
    """Our plan and accelerate's for the budget; None when planning failed."""
    comparison = None
    with guarded("planning the device map"):
        rows = edited.dropna()
        budget = parse_max_memory(
            ",".join(f"{d}={b}" for d, b in zip(rows["device"], rows["budget"], strict=True))
        )
        with right:
            st.code(",".join(f"{d}={budget_text(n)}" for d, n in budget.items()), language=None)
        comparison = cached_analysis(
            compare_with_accelerate, loaded.model, format_max_memory(budget), list(no_split)
        )

    if comparison is None:
        return None
    return comparison, budget


def _overview(comparison: Comparison) -> None:
    """How many keys and unplaced tensors each plan has, and whether accelerate's check passes."""
    ours = comparison.ours
    theirs_unplaced = comparison.accelerate_audit["device"].isna().sum()
    cols = st.columns(4)
    cols[0].metric("Keys: ours / accelerate's", f"{len(ours.device_map)} / {len(comparison.accelerate_map)}",
                   help="Entries of each device map")
    cols[1].metric("Unplaced by accelerate", int(theirs_unplaced),
                   help="Parameters and buffers that accelerate's map gives no device")
    cols[2].metric("Check of ours", "passes" if comparison.our_check is None else "fails",
                   help="accelerate.utils.check_device_map on plan_device_map's map")
    cols[3].metric("Check of accelerate's", "passes" if comparison.accelerate_check is None else "fails",
                   help="accelerate.utils.check_device_map on infer_auto_device_map's map")
    if comparison.accelerate_error:
        st.warning(
            "accelerate could not plan this model with this budget (`infer_auto_device_map` raised "
            f"{markdown_text(comparison.accelerate_error)}): only our plan is shown, and its tensors count "
            "as unplaced by accelerate."
        )
    elif comparison.accelerate_check:
        st.error(f"accelerate's own check rejects its map: {markdown_text(comparison.accelerate_check)}")


def _side_by_side(comparison: Comparison) -> None:
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


def _tabs(loaded: LoadedModel, comparison: Comparison, budget: dict) -> None:
    """Treemap, bytes per device, findings, decisions, actual placement and the map audit."""
    model = loaded.model
    ours = comparison.ours
    tabs = st.tabs(
        ["Treemap", "Bytes per device", "Findings", "Decisions", "Actual placement", "Audit a map"]
    )
    with tabs[0]:
        which = st.radio(
            "Show",
            ["our plan", "accelerate's plan", "where the tensors are now"],
            horizontal=True,
            key="dm_tree_which",
        )
        with guarded("drawing the treemap"):
            table = {"our plan": ours.audit, "accelerate's plan": comparison.accelerate_audit}.get(which)
            if table is None:
                table = cached_analysis(placement_table, model)
            st.plotly_chart(placement_treemap(table), key="dm_treemap")
    with tabs[1]:
        st.plotly_chart(usage_bars(ours.usage, "plan_device_map"), key="dm_usage_ours")
        st.plotly_chart(usage_bars(comparison.accelerate_usage, "accelerate (no room kept free is shown)"),
                        key="dm_usage_theirs")
    with tabs[2]:
        st.markdown("**Our plan**")
        findings_table(ours.findings, "dm_findings_ours", empty="Every parameter and buffer has a device.")
        st.markdown("**accelerate's plan**")
        findings_table(comparison.accelerate_findings, "dm_findings_theirs",
                       empty="accelerate's map places every tensor too.")
    with tabs[3]:
        st.caption("Each step of the planner, in order: budgets, room kept free, placements, splits, "
                   "buffers placed with their module, ties kept together.")
        paged_table(ours.records_frame().astype({"device": str}), "dm_records", page_size=100)
    with tabs[4]:
        _actual_placement(loaded, comparison)
    with tabs[5]:
        _audit_a_map(loaded, budget)


def _actual_placement(loaded: LoadedModel, comparison: Comparison) -> None:
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


def _audit_a_map(loaded: LoadedModel, budget: dict) -> None:
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


def main() -> None:
    st.set_page_config(page_title="Device map", layout="wide")
    loaded = _header()
    if loaded is None:
        return
    edited, no_split, right = _budget_inputs(loaded)
    planned = _plan(loaded, edited, no_split, right)
    if planned is None:
        return
    comparison, budget = planned
    _overview(comparison)
    _side_by_side(comparison)
    _tabs(loaded, comparison, budget)


main()
