"""Hook captures: what each layer really output, as detached copies, and which outputs were overwritten."""

from __future__ import annotations

import streamlit as st
import torch

from inspector import (
    Captures,
    LoadedModel,
    capture_activations,
    device_names,
    format_bytes,
    reference_drift,
    select_modules,
)
from inspector.dashboard import runs_at_once
from inspector.figures import (
    capture_heatmap,
    capture_histogram,
    clone_vs_reference_figure,
)
from inspector.structure import model_bytes
from inspector.utils import markdown_text
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.replays import replayed_section
from ui.run_captures import run_captures_section, stats_layout
from ui.running import model_runs
from ui.sidebar import model_picker
from ui.tables import findings_table, paged_table, show_frame

RESULTS = "cap_results"  # per browser session: {run key: Captures}; never shared between sessions
MODES = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "grad enabled": torch.enable_grad}


def _header() -> LoadedModel | None:
    """Title, explanation, a watched run's captures, and the loaded model (None when there is none)."""
    loaded = model_picker()

    st.title("Hook captures")
    st.caption("Each selected module's output is copied inside its forward hook (`detach().clone()`), "
               "so nothing that runs later can change it. A hook that keeps `output` itself keeps a "
               "reference: a following `ReLU(inplace=True)` or residual `+=` rewrites what it "
               "\"captured\". Modules whose live output changed after the hook are listed as mutated.")
    run_captures_section()  # a watched run's stored producer captures (no model needed)
    replayed_section(loaded)  # ?run=...&step=N&replay=1: a kept step of a watched run, replayed

    if loaded is None:
        st.info("Load a model in the sidebar to capture its activations.")
    return loaded


def _controls(loaded: LoadedModel) -> tuple[list[str], int, float, int | None, str, str, bool]:
    """Which modules, how many inputs, the byte budget, where copies go, autograd mode, references."""
    names = [n for n, _ in loaded.model.named_modules() if n]
    c1, c2 = st.columns([2, 1])
    patterns = c1.text_input(
        "Modules: names, glob patterns or class names, comma separated (empty: every module)",
        key="cap_patterns",
        placeholder="transformer.h.*.mlp, ReLU",
    )
    picked = c2.multiselect("…or pick modules", names, key="cap_picked")
    c3, c4, c5, c6 = st.columns(4)
    batch = c3.slider("Example inputs", 1, 4, 2, key="cap_batch")
    limit = c4.checkbox("Byte budget", value=True, key="cap_limit",
                        help="Stop capturing once the copies reach this size; the rest is listed as skipped")
    budget_mib = c4.number_input("Budget (MiB)", min_value=0.0, value=256.0, step=16.0, key="cap_budget",
                                 disabled=not limit)
    devices = [d for d in device_names() if d != "meta"]
    store_on = c5.selectbox("Store copies on", devices, key="cap_store",
                            help="cpu: pinned memory and non-blocking copies from a GPU")
    mode = c6.radio("Autograd mode", list(MODES), key="cap_mode", horizontal=False)
    teach = st.checkbox("Also keep bare references (what a naive hook would have seen)", value=True,
                        key="cap_teach")

    selection = [p.strip() for p in patterns.split(",") if p.strip()] + picked
    max_bytes = int(budget_mib * 2**20) if limit else None
    return selection, batch, budget_mib, max_bytes, store_on, mode, teach


def _capture(loaded: LoadedModel, selection: list[str], batch: int, max_bytes: int | None, store_on: str,
             mode: str, teach: bool) -> Captures | None:
    """This session's capture for these settings, run now when asked (or when the model is small)."""
    run_key = (
        st.session_state["mi_selection"].key,
        tuple(selection),
        batch,
        max_bytes,
        store_on,
        mode,
        teach,
    )

    caps = None
    with guarded("capturing activations"):
        loaded.check_runnable()
        chosen = select_modules(loaded.model, selection or None)  # unknown names: a clear error
        results = st.session_state.setdefault(RESULTS, {})
        caps = results.get(run_key)
        auto = cached_analysis(runs_at_once, loaded.model)
        if caps is None and not auto:
            st.info(
                f"{markdown_text(loaded.name)} holds {format_bytes(model_bytes(loaded.model))} of weights: "
                "capturing "
                f"its {len(chosen)} selected modules waits for the button. Narrow the selection first "
                "(e.g. `transformer.h.0*`) to keep the copies small and the capture quick."
            )
        again = st.button("Capture again" if caps is not None or auto else "Capture", key="cap_again",
                          type="secondary" if caps is not None or auto else "primary")
        if again or (caps is None and auto):
            inputs = loaded.example_inputs(batch)
            with st.spinner(f"Capturing {len(chosen)} modules…"), loaded.lock, MODES[mode]():
                caps = capture_activations(loaded.model, inputs, modules=selection or None, store_on=store_on,
                                           max_bytes=max_bytes, keep_references=teach)
            results.clear()  # keep one capture per session: copies can be large
            results[run_key] = caps
    return caps


def _summary(caps: Captures, budget_mib: float) -> None:
    """How much was captured, and which outputs were changed in place."""
    m1, m2, m3, m4 = st.columns(4)
    m1.metric("Captured outputs", len(caps.outputs))
    m2.metric("Bytes held", format_bytes(caps.total_bytes))
    m3.metric("Mutated after capture", len(caps.mutated))
    m4.metric("Skipped", len(caps.skipped))

    if not caps.outputs:
        reason = (f"the byte budget of {budget_mib:g} MiB left out all {len(caps.skipped)} selected outputs"
                  if caps.skipped else "no selected module ran in the forward pass")
        st.warning(f"Nothing was captured: {reason}, so nothing can be said about in-place changes. "
                   "Raise **Budget (MiB)** or untick **Byte budget**, then capture again.")
    elif caps.mutated:
        lines = [f"- `{m.module}{m.path}` overwritten by `{m.by or 'code outside any module'}` "
                 f"(seen by {m.how}, largest change {m.max_abs_change:.4g})" for m in caps.mutations]
        st.warning("These live outputs were changed in place after their hook ran; a bare reference to them "
                   "is wrong, the copies here are right:\n\n" + "\n".join(lines))
    else:
        st.success("No captured output was changed in place after its hook ran.")


def _statistics(caps: Captures) -> None:
    """Statistics of every copy, and what was not captured."""
    st.subheader("Statistics of the copies")
    paged_table(
        caps.stats, key="cap_stats", filter_columns=["module", "dtype", "shape"], **stats_layout(caps.stats)
    )
    if caps.skipped:
        st.subheader("Not captured")
        paged_table(caps.skipped_table, key="cap_skipped")


def _one_capture(caps: Captures, teach: bool) -> None:
    """Histogram and heatmap of one module's output."""
    if caps.order:
        st.subheader("One capture")
        default = next(iter(caps.mutated), caps.order[0])
        shown = st.selectbox("Module", caps.order, index=caps.order.index(default), key="cap_show")
        ref = caps.references.get(shown) if teach else None
        left, right = st.columns(2)
        left.plotly_chart(capture_histogram(caps.outputs[shown], title=f"{shown}: values", reference=ref),
                          key="cap_hist")
        right.plotly_chart(
            capture_heatmap(caps.outputs[shown], title=f"{shown}: 2-D slice"), key="cap_heatmap"
        )


def _copy_vs_reference(caps: Captures, teach: bool) -> None:
    """How far a bare reference drifted from the copy."""
    if teach and caps.references:
        st.subheader("Copy vs bare reference")
        st.caption("How far the reference a naive hook keeps is from what the module really output, after "
                   "the forward pass. Red: corrupted captures.")
        drift = reference_drift(caps)
        st.plotly_chart(clone_vs_reference_figure(drift), key="cap_clone_vs_bare")
        with st.expander("As a table"):
            show_frame(drift)


def main() -> None:
    st.set_page_config(page_title="Hook captures", layout="wide")
    loaded = _header()
    if loaded is None:
        return
    if not loaded.is_meta and not model_runs(loaded):
        return
    selection, batch, budget_mib, max_bytes, store_on, mode, teach = _controls(loaded)
    caps = _capture(loaded, selection, batch, max_bytes, store_on, mode, teach)
    if caps is None:
        return
    _summary(caps, budget_mib)
    _statistics(caps)
    _one_capture(caps, teach)
    _copy_vs_reference(caps, teach)
    st.subheader("Findings")
    findings_table(caps.findings, key="cap_findings", empty="Nothing to report.")


main()
