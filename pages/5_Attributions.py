"""Attributions: which inputs and which layers drove one output (captum)."""

from __future__ import annotations

import json
import time
from typing import Any

import streamlit as st

from inspector import METHODS, Attribution, LoadedModel, attribute, format_bytes, methods_for
from inspector.attribution import conv_layers, default_layer, layer_names
from inspector.dashboard import quick_target_info, runs_at_once
from inspector.figures import completeness_line, conductance_bars, image_overlay, token_heatmap
from inspector.structure import model_bytes
from inspector.utils import markdown_code, markdown_text
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.running import model_runs
from ui.sidebar import model_picker
from ui.tables import findings_table, paged_table
from ui.tokens import token_decoder

ASKED = "attr_asked"  # per browser session: the settings whose attributions were asked for


def progress_text(share: float, elapsed: float) -> str:
    """``"40% done, about 1 min 20 s left"`` from the share done and the seconds it took."""
    if share <= 0.02 or elapsed < 1:
        return f"{share:.0%} done"
    left = elapsed * (1 - share) / share
    return (
        f"{share:.0%} done, about "
        + (f"{left:.0f} s" if left < 90 else f"{left // 60:.0f} min {left % 60:.0f} s")
        + " left"
    )


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


def _run(loaded: LoadedModel, inputs: Any, method: str, target: int | None, position: int,
         layers: list[str], options: dict) -> list[Attribution]:
    """The attributions, one per layer (or one on the inputs), with progress and a stop button."""
    spec = METHODS[method]
    results = []
    with guarded(f"running {spec.label}"):
        with st.status(f"Running {spec.label}…", expanded=True) as status:
            bar = st.progress(0.0)
            st.button(
                "Stop", key="attr_cancel", icon=":material/stop:", help="Stop this run; nothing is kept"
            )
            started = time.monotonic()
            try:
                for i, layer in enumerate(layers or [None]):
                    what = f"{spec.label}" + (f" on {markdown_text(layer)}" if layer else "") + \
                        (f" ({i + 1} of {len(layers)})" if len(layers) > 1 else "")
                    status.update(label=f"Running {what}…")

                    def step(done: int, expected: int, i: int = i, what: str = what) -> None:
                        """captum's forward passes so far, as a share of all layers' work."""
                        share = min((i + done / max(expected, 1)) / max(len(layers), 1), 1.0)
                        bar.progress(
                            share, text=f"{what}: {progress_text(share, time.monotonic() - started)}"
                        )

                    # The lambda keeps the callback out of the cache key, so a rerun reuses the result.
                    results.append(
                        cached_analysis(
                            lambda *a, **k: attribute(*a, progress=step, **k),
                            loaded,
                            inputs,
                            method,
                            target,
                            layer,
                            position=position,
                            cache_scope="session",
                            **options,
                        )
                    )
            except Exception:
                status.update(
                    label=f"{spec.label} failed: see the message below", state="error", expanded=False
                )
                raise
            bar.empty()
            status.update(label=f"{spec.label}: done", state="complete", expanded=False)
    return results


def _completeness(results: list[Attribution]) -> None:
    """Whether the attributions add up, and NaN values."""
    result = results[0]
    comp = result.completeness()
    line = completeness_line(result) if len(results) == 1 else \
        " ".join(f"{r.layer}: {completeness_line(r)}" for r in results)
    if comp is None:
        st.info(line)
    elif all(r.completeness().trusted for r in results):
        st.success(line)
    else:
        st.warning(line)

    nans = int(sum(r.summary["nans"].sum() for r in results))
    if nans:
        st.error(f"{nans} attribution values are NaN: they are left blank in the figures, not drawn as "
                 "zeros. See the findings below.")


def _figures(loaded: LoadedModel, results: list[Attribution], method: str, batch: int) -> None:
    """What was attributed, then the token heatmap, image overlays or bars."""
    result = results[0]
    spec = METHODS[method]
    where = f"layer {markdown_code(result.layer)}" if result.layer else "the inputs"
    st.markdown(f"**{spec.label}** ({result.captum_method}) on {where}, target **{result.target}**"
                + (f" at position **{result.position}**" if result.position is not None else ""))

    if result.token_model:
        st.plotly_chart(token_heatmap(result, decode=token_decoder(loaded)), key="attr_token_heatmap")
    elif result.pixel_map() is not None:
        cols = st.columns(min(batch, 4))
        for i, col in enumerate(cols):
            col.plotly_chart(image_overlay(result, sample=i), key=f"attr_overlay_{i}")
    if len(results) > 1:
        st.plotly_chart(conductance_bars(results), key="attr_layer_bars")
    if (
        method == "layer_conductance"
        and len(results) == 1
        or not result.token_model
        and result.pixel_map() is None
    ):
        st.plotly_chart(conductance_bars(result), key="attr_unit_bars")


def _scores(loaded: LoadedModel, results: list[Attribution], method: str) -> None:
    """Scores per layer, findings and the JSON download."""
    st.subheader("Scores")
    for r in results:
        paged_table(r.summary, f"attr_summary_{r.layer or 'inputs'}",
                    caption="score: attributions summed per token, channel or unit (NaN stays NaN)")

    st.subheader("Findings")
    findings_table([f for r in results for f in r.findings], "attr_findings")

    st.download_button("Download as JSON", json.dumps([r.to_dict() for r in results], indent=2,
                                                      allow_nan=False),
                       file_name=f"attributions-{loaded.name}-{method}.json", mime="application/json",
                       key="attr_download")


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
    results = _run(loaded, inputs, method, target, position, layers, options)
    if not results:
        return
    _completeness(results)
    _figures(loaded, results, method, batch)
    _scores(loaded, results, method)


main()
