"""Attributions: which inputs and which layers drove one output (captum)."""

from __future__ import annotations

from typing import Any

import streamlit as st

from inspector import METHODS, LoadedModel, format_bytes, methods_for
from inspector.attribution import conv_layers, default_layer, layer_names
from inspector.dashboard import quick_target_info, runs_at_once
from inspector.structure import model_bytes
from inspector.utils import markdown_text
from ui.attributions import completeness_section, figures_section, run_attributions, scores_section
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.running import model_runs
from ui.sidebar import model_picker

ASKED = "attr_asked"  # per browser session: the settings whose attributions were asked for


def _header() -> LoadedModel | None:
    """Title, explanation and the loaded model (None when there is none)."""
    loaded = model_picker()

    st.title("Attributions")
    st.caption("Which input tokens or pixels, and which layers, drove one output: a class score, or the "
               "logit of a chosen next token. Computed by captum (Integrated Gradients, Saliency, "
               "Input x Gradient, Layer Integrated Gradients, Layer Conductance, GradCAM) on the model's "
               "example inputs, in eval mode; the model is left as it was.")

    if loaded is None:
        st.info("Load a model in the sidebar to attribute its outputs.")
    return loaded


def _inputs(loaded: LoadedModel) -> tuple[int, Any, Any, list[str]] | None:
    """How many example inputs, the inputs, what their outputs are, the methods that apply."""
    setup = None
    with guarded("preparing the attribution inputs"):
        batch = st.sidebar.slider("Example inputs", 1, 4, 1, key="attr_batch",
                                  help="How many example inputs to attribute (one row each)")
        inputs = loaded.example_inputs(batch)
        info = cached_analysis(quick_target_info, loaded, inputs)
        setup = (inputs, info, methods_for(loaded, inputs))

    if setup is None:
        return None
    return (batch, *setup)


def _settings(loaded: LoadedModel, inputs: Any, info: Any,
              methods: list[str]) -> tuple[str, int | None, int, list[str], dict] | None:
    """Method, target, position, layers and steps; None while no layer is chosen."""
    c1, c2, c3 = st.columns(3)
    method = c1.selectbox("Method", methods, format_func=lambda m: METHODS[m].label, key="attr_method",
                          help="On token ids, Integrated Gradients runs on the input embedding's output")
    target = None
    if info.outputs > 1:
        target = int(c2.number_input(f"Target ({info.kind}, 0..{info.outputs - 1})", 0, info.outputs - 1,
                                     min(1, info.outputs - 1), key="attr_target"))
    else:
        c2.markdown("The model gives one output per sample: no target to choose.")
    position = -1
    if info.positions is not None:
        position = int(c3.number_input(f"Position (0..{info.positions - 1})", 0, info.positions - 1,
                                       info.positions - 1, key="attr_position",
                                       help="The sequence position whose next-token logit is attributed"))

    spec = METHODS[method]
    names = layer_names(loaded.model)
    layers: list[str] = []
    if spec.on_layer:
        default = default_layer(loaded, method, inputs)
        if method == "layer_conductance":
            pick = [default or (conv_layers(loaded.model) or names)[-1]]
            layers = st.multiselect("Layers (one bar per layer when several)", names, pick, key="attr_layers")
        else:
            layers = [st.selectbox("Layer", names, names.index(default) if default in names else 0,
                                   key=f"attr_layer_{method}")]
        if not layers:
            st.info("Choose at least one layer.")
            return None
    options = {}
    if spec.has_delta:
        options["n_steps"] = st.slider("Integration steps (n_steps)", 4, 200, 50, key="attr_steps",
                                       help="More steps: a smaller convergence delta, a slower run")
    return method, target, position, layers, options


def _asked(loaded: LoadedModel, run_key: tuple, label: str) -> bool:
    """Whether to run now: at once on a small model, else once the button was pressed for these settings."""
    auto = cached_analysis(runs_at_once, loaded.model)
    asked = st.session_state.setdefault(ASKED, set())
    if st.session_state.get("attr_cancel"):  # pressed while the run went on: that run stopped, forget it
        asked.discard(run_key)
        st.warning("Stopped. Press **Compute attributions** to run it again (fewer **Integration steps** "
                   "run faster).")
        return False
    if not auto and run_key not in asked:
        st.info(f"{markdown_text(loaded.name)} holds {format_bytes(model_bytes(loaded.model))} of weights: "
                f"{label} runs a forward and backward pass per step, which takes a while on a "
                "model this size, so it waits for the button. Results stay here for this browser session.")
    if st.button("Compute attributions", key="attr_compute", type="primary"):
        asked.add(run_key)
    return auto or run_key in asked



def main() -> None:
    st.set_page_config(page_title="Attributions", layout="wide")
    loaded = _header()
    if loaded is None:
        return
    if loaded.is_meta:
        st.info(
            f"{markdown_text(loaded.name)} is on the meta device: it has a structure but no weights, so "
            "there is no output to attribute. Load it on a real device with a checkpoint."
        )
        return
    if not model_runs(loaded):
        return
    prepared = _inputs(loaded)
    if prepared is None:
        return
    batch, inputs, info, methods = prepared
    settings = _settings(loaded, inputs, info, methods)
    if settings is None:
        return
    method, target, position, layers, options = settings
    run_key = (st.session_state["mi_selection"].key, batch, method, target, position, tuple(layers),
               tuple(sorted(options.items())))
    if not _asked(loaded, run_key, METHODS[method].label):
        return
    results = run_attributions(loaded, inputs, method, target, position, layers, options)
    if not results:
        return
    completeness_section(results)
    figures_section(loaded, results, method, batch)
    scores_section(loaded, results, method)


main()
