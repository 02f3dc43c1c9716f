"""Alias graph: which tensors are really one tensor, and which conversions split them."""

from __future__ import annotations

import streamlit as st

from inspector import (
    CONVERSIONS,
    LoadedModel,
    alias_analysis,
    conversion_table,
    device_names,
    format_bytes,
    format_count,
    graph_data,
)
from inspector.figures import alias_graph_figure
from inspector.utils import markdown_text
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.sidebar import model_picker
from ui.tables import findings_table, paged_table, show_frame

KIND_HELP = {
    "same-object": "one Python object under several names; parameters() yields it once",
    "shared-storage": "different objects over exactly the same memory; parameters() counts it twice",
    "overlapping-view": "different objects whose bytes overlap partly",
}
OUTCOME_ICON = {
    "kept": ":green[:material/check_circle: kept]",
    "weakened": ":orange[:material/warning: weakened]",
    "broken": ":red[:material/link_off: broken]",
    "error": ":red[:material/error: error]",
    "no ties": ":gray[:material/remove: no ties]",
}
DEFAULT = ["to-float64-overwrite", "to-float32-overwrite", "move-model-float64", "move-model-float32"]


def _header() -> LoadedModel | None:
    """Title, explanation and the loaded model (None when there is none)."""
    loaded = model_picker()

    st.title("Alias graph")
    st.caption("Tied weights (GPT-2's token embedding and output head) are one tensor under two names. "
               "A conversion that wraps each name separately can split them without a word: the model "
               "then trains two copies and the unique parameter count jumps. This page shows every alias "
               "and checks conversions on a copy of the model.")

    if loaded is None:
        st.info("Load a model in the sidebar to see its aliases.")
    return loaded


def _aliases(loaded: LoadedModel) -> None:
    """Metrics, alias groups, disjoint views, the graph and the findings."""
    analysis = None
    with guarded("finding aliases"):
        analysis = cached_analysis(alias_analysis, loaded.model)

    if analysis is not None:
        cols = st.columns(4)
        cols[0].metric("Alias groups", len(analysis.groups))
        cols[1].metric(
            "Names (parameters and buffers)", format_count(analysis.names), help=f"{analysis.names:,}"
        )
        cols[2].metric(
            "Unique parameter elements",
            format_count(analysis.unique_numel),
            help=f"{analysis.unique_numel:,}: what parameters() counts, each Parameter object once",
        )
        cols[3].metric("Counting every name", format_count(analysis.numel_with_aliases),
                       help=f"{analysis.numel_with_aliases:,}",
                       delta=(f"+{format_count(analysis.numel_with_aliases - analysis.unique_numel)}"
                              if analysis.numel_with_aliases != analysis.unique_numel else None),
                       delta_color="off")
        if analysis.identity_only:
            st.info("This model is on the meta device: it holds no memory, so aliases are found by object "
                    "identity only. Shared storage and overlapping views need real weights.")

        st.subheader("Alias groups")
        st.markdown(" · ".join(f"**{k}**: {v}" for k, v in KIND_HELP.items()))
        if analysis.groups:
            frame = analysis.to_frame()
            paged_table(frame, "aliases_groups", caption="names[0] is the name named_parameters() keeps",
                        column_config={"names": st.column_config.TextColumn()})
        else:
            st.success("No two names share a tensor or memory in this model.")
        for d in analysis.disjoint:
            regions = " | ".join(", ".join(r) for r in d.regions)
            st.info(
                f"Disjoint views of one storage ({format_bytes(d.storage_nbytes)} on "
                f"{markdown_text(d.device)}): "
                f"{markdown_text(regions)}. "
                "They share a storage but no bytes, so they are not aliases: writing one never "
                "changes the other."
            )

        st.subheader("Graph")
        with guarded("drawing the alias graph"):
            data = cached_analysis(graph_data, loaded.model, list(analysis.groups))
            fig = cached_analysis(alias_graph_figure, data)
            st.plotly_chart(fig, width="stretch", key="aliases_graph")
            st.caption("Squares are modules, circles parameters, diamonds buffers; each alias group has "
                       "its own colour, with an extra edge from every other module that holds it.")
        if analysis.findings:
            findings_table(list(analysis.findings), "aliases_findings")


def _conversion_controls(loaded: LoadedModel) -> None:
    """Which conversions to run, on which device; the buttons store the run."""
    st.subheader("Conversion check")
    st.caption("Each conversion runs on a deep copy of the model (the loaded model is never changed) and "
               "reports, per alias group, whether the tie was **kept**, **weakened** (one object became "
               "several objects over one memory) or **broken** (separate memory), with the unique "
               "parameter count after. torch's overwrite-on-conversion flag is restored afterwards.")
    picked = st.multiselect("Conversions", list(CONVERSIONS), default=DEFAULT, key="aliases_conversions",
                            format_func=lambda n: CONVERSIONS[n].label)
    targets = [d for d in device_names() if d != "meta"]
    here = loaded.device if loaded.device in targets else "cpu"
    device = st.selectbox("Target device", targets, index=targets.index(here), key="aliases_device",
                          help="Where .to(device), to_empty(device) and the safetensors loads put the copy.")
    left, right = st.columns(2)
    if left.button("Run conversion check", type="primary", key="aliases_check"):
        st.session_state["aliases_run"] = {"names": tuple(picked), "retie": False, "device": device}
    if right.button("Re-tie after each conversion", key="aliases_retie",
                    help="Run the conversions again, then retie() each converted copy from a snapshot "
                         "taken before, and show what it restored."):
        st.session_state["aliases_run"] = {"names": tuple(picked), "retie": True, "device": device}


def _conversion_results(loaded: LoadedModel) -> None:
    """The table of outcomes and findings of the stored run."""
    run = st.session_state.get("aliases_run")
    if run and run["names"]:
        with guarded("checking conversions"), st.spinner("Converting copies of the model…"):
            table, results = cached_analysis(conversion_table, loaded.model, list(run["names"]),
                                             device=run["device"], retie_after=run["retie"])
            outcomes = table[table["outcome"].isin(list(OUTCOME_ICON))]
            st.markdown(
                " · ".join(
                    f"**{c}**: {OUTCOME_ICON[o]}"
                    for c, o in dict(zip(outcomes["conversion"], outcomes["outcome"], strict=True)).items()
                )
            )
            lead = ["conversion", "outcome", "unique", "same_object", "same_storage"]  # the result first
            shown = table[[c for c in lead if c in table.columns]
                          + [c for c in table.columns if c not in lead]]
            if shown["error"].isna().all():
                shown = shown.drop(columns=["error"])
            show_frame(shown, {"unique": st.column_config.NumberColumn(
                "unique elements", format="localized",
                help="unique parameter elements after the conversion")})
            findings = [f for r in results for f in r.findings]
            if run["retie"]:
                findings += [f for r in results for f in r.retied]
                fixed = [r for r in results if r.retied]
                if fixed:
                    st.success(" · ".join(f"{r.label}: {format_count(r.unique_after)} → "
                                          f"{format_count(r.unique_after_retie)} after re-tie"
                                          for r in fixed))
            findings_table(findings, "aliases_conversion_findings",
                           empty="Every tie survived the chosen conversions.")
    elif run:
        st.warning("Pick at least one conversion.")


def main() -> None:
    st.set_page_config(page_title="Alias graph", layout="wide")
    loaded = _header()
    if loaded is None:
        return
    _aliases(loaded)
    _conversion_controls(loaded)
    _conversion_results(loaded)


main()
