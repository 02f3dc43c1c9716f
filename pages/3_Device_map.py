"""Device map: plan where every parameter and buffer goes, side by side with accelerate's plan."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from inspector import (
    Comparison,
    LoadedModel,
    compare_with_accelerate,
    parse_max_memory,
    placement_table,
)
from inspector.figures import placement_treemap, usage_bars
from inspector.placement import budget_text, format_max_memory, no_split_choices, suggest_budget
from inspector.utils import markdown_text
from ui.cache import cached_analysis
from ui.device_map import actual_placement, audit_a_map, side_by_side
from ui.errors import guarded
from ui.sidebar import model_picker
from ui.tables import findings_table, paged_table


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
        classes, default = no_split_choices(model)
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
        actual_placement(loaded, comparison)
    with tabs[5]:
        audit_a_map(loaded, budget)


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
    side_by_side(comparison)
    _tabs(loaded, comparison, budget)


main()
