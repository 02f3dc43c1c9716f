"""Flatten map: where each parameter sits in the flat vector, and how big its gradient is."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from inspector import (
    GradientNorms,
    LoadedModel,
    format_count,
    gradient_report,
    locate,
    loss_gradients,
    offset_findings,
    offset_map,
)
from inspector.offsets import vector_lengths
from inspector.utils import markdown_code, markdown_text
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.flatten_map import flat_vector, gradient_norms_section, roundtrip_section, side_by_side
from ui.running import model_runs
from ui.sidebar import model_picker
from ui.tables import findings_table

GRADS = "offsets_grads"  # per browser session: {model key: LossGradients}; never on the shared model


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
    n = vector_lengths(full, trainable)
    total, frozen, trainable_total = n["total"], n["frozen"], n["trainable"]

    cols = [*st.columns(3), *st.columns(3)]  # two rows: "69.0 billion" needs the room
    cols[0].metric("Flat vector length", format_count(total), help=f"{total:,} elements")
    cols[1].metric(
        "Trainable-only length", format_count(trainable_total), help=f"{trainable_total:,} elements"
    )
    cols[2].metric("Frozen elements (holes)", format_count(frozen),
                   help=f"{frozen:,} elements in parameters_to_vector(model.parameters()) but not in a "
                        "trainable-only vector")
    cols[3].metric("Tensors in parameters()", f"{n['tensors']:,}")
    cols[4].metric("Aliases kept once", n["aliases"])
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
    flat_vector(full, trainable, report)
    _find_index(full, trainable)
    side_by_side(full, trainable)
    gradient_norms_section(report)
    roundtrip_section(loaded, total)
    st.subheader("Findings")
    findings_table(findings, "offsets_findings", empty="Nothing stops parameters_to_vector here.")


main()
