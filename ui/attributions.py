"""The Attributions page's results: the run with its progress, completeness, figures, scores."""

from __future__ import annotations

import json
import time
from typing import Any

import streamlit as st

from inspector import METHODS, Attribution, LoadedModel, attribute
from inspector.figures import completeness_line, conductance_bars, image_overlay, token_heatmap
from inspector.utils import markdown_code, markdown_text, progress_text
from ui.cache import cached_analysis
from ui.errors import guarded
from ui.tables import findings_table, paged_table
from ui.tokens import token_decoder


def run_attributions(loaded: LoadedModel, inputs: Any, method: str, target: int | None, position: int,
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


def completeness_section(results: list[Attribution]) -> None:
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


def figures_section(loaded: LoadedModel, results: list[Attribution], method: str, batch: int) -> None:
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


def scores_section(loaded: LoadedModel, results: list[Attribution], method: str) -> None:
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
