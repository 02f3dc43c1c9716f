"""Flatten map: where each parameter sits in the flat vector, and how big its gradient is."""

from __future__ import annotations

import math

import pandas as pd
import streamlit as st

from inspector import (
    GradientNorms,
    InspectorError,
    LoadedModel,
    format_count,
    gradient_report,
    locate,
    loss_gradients,
    offset_findings,
    offset_map,
)
from inspector.figures import layer_norm_bars, offset_strip
from inspector.offsets import display_table, flatten_roundtrip
from inspector.utils import markdown_code, markdown_text
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.running import model_runs
from ui.sidebar import model_picker
from ui.tables import findings_table, paged_table

GRADS = "offsets_grads"  # per browser session: {model key: LossGradients}; never on the shared model
ROUNDTRIP_MAX = 20_000_000  # elements; the round trip holds two extra copies of the parameters


def _header() -> LoadedModel | None:
    """Title, explanation and the loaded model (None when there is none)."""
    loaded = model_picker()

    st.title("Flatten map")
    st.caption("Gradient checks, custom optimizers and \"my gradient vector has the wrong length\" all need "
               "to know where each parameter sits in `parameters_to_vector` order. Four things people get "
               "wrong: `parameters()` does **not** skip frozen parameters (so filtering on `requires_grad` "
               "moves every later offset), `parameters_to_vector` **copies**, buffers are not parameters, "
               "and a tied parameter appears **once**.")

    if loaded is None:
        st.info("Load a model in the sidebar to see its flat vector.")
    return loaded


def _maps(loaded: LoadedModel) -> tuple[pd.DataFrame, pd.DataFrame, list] | None:
    """The offset maps (all parameters, trainable only) and their findings; None when they failed."""
    full = trainable = None
    findings: list = []
    with guarded("building the offset maps"):
        with_buffers = st.toggle(
            "List buffers after the parameters",
            value=False,
            key="offsets_buffers",
            help="Buffers are not parameters: they come after, and never shift an offset",
        )
        full = cached_analysis(offset_map, loaded.model, include_buffers=with_buffers)
        trainable = cached_analysis(offset_map, loaded.model, trainable_only=True)
        findings = list(cached_analysis(offset_findings, loaded.model))

    if full is None:
        return None
    return full, trainable, findings


def _metrics(full: pd.DataFrame, trainable: pd.DataFrame) -> int:
    """The lengths of both vectors; returns the number of parameter elements."""
    params = full[full["kind"] == "parameter"]
    total = int(params["numel"].sum())
    frozen = int(params.loc[~params["requires_grad"], "numel"].sum())
    trainable_total = int(trainable["numel"].sum())

    cols = [*st.columns(3), *st.columns(3)]  # two rows: "69.0 billion" needs the room
    cols[0].metric("Flat vector length", format_count(total), help=f"{total:,} elements")
    cols[1].metric(
        "Trainable-only length", format_count(trainable_total), help=f"{trainable_total:,} elements"
    )
    cols[2].metric("Frozen elements (holes)", format_count(frozen),
                   help=f"{frozen:,} elements in parameters_to_vector(model.parameters()) but not in a "
                        "trainable-only vector")
    cols[3].metric("Tensors in parameters()", f"{len(params):,}")
    cols[4].metric("Aliases kept once", int(params["aliases"].map(len).sum()))
    return total


def _backward(loaded: LoadedModel):
    """The backward-pass button; returns this session's gradients of the model (or None)."""
    st.subheader("Backward pass")
    grads_note = ("This model is on the meta device: it has no numbers, so no gradients." if loaded.is_meta
                  else None if loaded.has_loss else "This model defines no loss, so it cannot run backward.")
    st.caption(
        "The button runs the model's loss on its example inputs in eval mode, under the model's lock, "
        "and computes the gradients with `torch.autograd.grad`. They are kept for this browser session "
        "only: the model is shared by every session, and its `.grad` is never set."
    )
    key = st.session_state["mi_selection"].key
    session_grads = st.session_state.setdefault(GRADS, {})  # {model key: LossGradients}, this session's own
    if st.button(
        "Run a backward pass",
        key="offsets_backward",
        type="primary",
        disabled=grads_note is not None,
        help=grads_note,
    ) and model_runs(loaded):
        with (
            guarded("running a backward pass"),
            st.status("Running a backward pass…", expanded=True) as status,
        ):
            try:
                result = loss_gradients(loaded, progress=st.write)
            except Exception:
                status.update(
                    label="The backward pass failed: see the message below", state="error", expanded=False
                )
                raise
            session_grads[key] = result
            status.update(
                label=f"Backward pass done in {result.seconds:.1f} s", state="complete", expanded=False
            )
    if grads_note:
        st.info(grads_note)
    mine = session_grads.get(key)
    if mine is not None:
        st.success(mine.message)
    return mine


def _gradient_report(loaded: LoadedModel, mine) -> GradientNorms | None:
    """Gradient norms of this session's gradients; None on the meta device or when it failed."""
    report = None
    if not loaded.is_meta:
        with guarded("reading gradient norms"), loaded.lock:
            report = gradient_report(loaded.model, grads=mine.grads if mine is not None else {})
    return report


def _flat_vector(full: pd.DataFrame, trainable: pd.DataFrame, report: GradientNorms | None) -> None:
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


def _find_index(full: pd.DataFrame, trainable: pd.DataFrame) -> None:
    """Which tensor holds a flat index."""
    st.subheader("Find a flat index")
    left, right = st.columns([1, 2])
    index = left.number_input("Flat index", min_value=0, value=0, step=1, key="offsets_index")
    which = left.radio("Vector", ["parameters()", "trainable only"], horizontal=True, key="offsets_which")
    with right, guarded("locating the index"):
        loc = locate(full if which == "parameters()" else trainable, int(index))
        st.success(markdown_text(loc.describe()))
        if not loc.requires_grad:
            st.warning(
                f"{markdown_code(loc.name)} is frozen: a trainable-only gradient vector does not contain it."
            )


def _side_by_side(full: pd.DataFrame, trainable: pd.DataFrame) -> None:
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


def _gradient_norms(report: GradientNorms | None) -> None:
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


def _roundtrip(loaded: LoadedModel, total: int) -> None:
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


def main() -> None:
    st.set_page_config(page_title="Flatten map", layout="wide")
    loaded = _header()
    if loaded is None:
        return
    maps = _maps(loaded)
    if maps is None:
        return
    full, trainable, findings = maps
    total = _metrics(full, trainable)
    mine = _backward(loaded)
    report = _gradient_report(loaded, mine)
    if report is not None:
        findings += report.findings
    _flat_vector(full, trainable, report)
    _find_index(full, trainable)
    _side_by_side(full, trainable)
    _gradient_norms(report)
    _roundtrip(loaded, total)
    st.subheader("Findings")
    findings_table(findings, "offsets_findings", empty="Nothing stops parameters_to_vector here.")


main()
