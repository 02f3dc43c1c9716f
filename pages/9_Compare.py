"""Compare: what changed from the loaded model to another model or checkpoint, or between two runs."""

from __future__ import annotations

import streamlit as st

from inspector import InspectorError, LoadedModel, compare
from inspector.comparison import (
    DEFAULT_TOLERANCE,
    RunComparison,
    WeightComparison,
    compare_runs,
    shown_step_columns,
)
from inspector.figures import module_change_bars, run_divergence_figure
from inspector.utils import markdown_text
from inspector.watching import parse_run_bytes, read_run
from ui.budget import request_budget
from ui.cache import cached_analysis
from ui.compare_view import (
    changed_first,
    file_stamp,
    nonfinite_steps,
    pick_b,
    run_module_config,
    run_module_rows,
    run_step_config,
    run_step_rows,
    tensor_rows,
    went_nonfinite,
)
from ui.errors import guarded
from ui.runs import checked_path, overlay_runs, pick_from_folders
from ui.sidebar import model_picker
from ui.tables import findings_table, paged_table

EVERY_NUMBER_SHOWN = 200  # step-level numbers the per-step table shows at most (a run may hold 100,000 lrs)


def _header() -> tuple[LoadedModel | None, str]:
    """Title, explanation and what to compare; returns the loaded model (A) and the mode."""
    loaded = model_picker()

    st.title("Compare")
    st.caption(
        "What changed between two models or checkpoints, tensor by tensor (bitwise equal or not, the "
        "largest change, ‖B−A‖/‖A‖), summed per module; ties broken or added, renamed prefixes, dtype "
        "conversions and the precision they lost, tensors a fine-tune never touched. Or two training runs "
        "side by side: the first step where they part, and the modules that part first."
    )
    mode = st.radio("Compare", ["the loaded model with B", "two run files"], horizontal=True, key="cmp_mode")
    return loaded, mode


def show_weights(result: WeightComparison) -> None:
    f = result.facts
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Tensors compared", f["compared"])
    c2.metric("Changed", f["changed"])
    c3.metric("Bitwise equal", f["equal"])
    c4.metric("Only in A / only in B", f"{f['missing']} / {f['extra']}",
              help="Names one side lacks. A tied name a file stores once (as safetensors saves a tie) is not "
                   "counted: loading fills it through the tie (status stored-once below).")
    first = changed_first(result)
    st.markdown(f":blue[**{markdown_text(first.line())}**]")
    for message in first.low_rank:
        st.info(f"**low-rank-update**: {markdown_text(message)}", icon=":material/linear_scale:")
    st.caption(markdown_text(f["summary"]))
    st.subheader("Findings")
    findings_table(
        list(result.findings),
        key="cmp_findings",
        empty="Nothing to report: no tie, name, dtype or "
        "shape changed, and every trainable tensor that could change did.",
    )
    st.subheader("Change per module")
    st.plotly_chart(module_change_bars(result.modules), width="stretch", key="cmp_modules_chart")
    st.subheader("Tensors")
    only = st.toggle("Only tensors that differ", value=True, key="cmp_only_changed")
    table = result.tensors[result.tensors["status"] != "equal"] if only else result.tensors
    paged_table(tensor_rows(table), key="cmp_tensors")


def show_runs(result: RunComparison, runs: tuple[object, object] = (None, None)) -> None:
    c1, c2, c3 = st.columns(3)
    c1.metric("Common steps", result.facts["common_steps"])
    c2.metric("First divergence", "none" if result.first_divergence is None else result.first_divergence)
    c3.metric("Modules that part first", len(result.first_modules),
              help="Modules whose recorded numbers (gradient or parameter norm, update ratio) differ beyond "
                   "the tolerance at the first divergence")
    went = went_nonfinite(runs, (result.a, result.b))
    for _, line in went:
        st.markdown(f":red[:material/error: **{markdown_text(line)}**]")
    findings_table(list(result.findings), key="cmp_run_findings")
    if result.first_modules:
        why = (" (a run went non-finite there, so every module parts: the module that began it is named "
               "above)" if any(step == result.first_divergence for step, _ in went) else "")
        st.markdown(f"Modules beyond the tolerance at the first divergence{why}, largest first: "
                    + ", ".join(f"`{markdown_text(m)}`" for m in result.first_modules[:20]))
    nonfinite = tuple(None if r is None else nonfinite_steps(r) for r in runs)
    st.plotly_chart(run_divergence_figure(result.steps, result.first_divergence, result.a, result.b,
                                          nonfinite=nonfinite), width="stretch", key="cmp_runs_chart")
    st.subheader("Per module")
    st.caption(
        "Each module's recorded numbers in A against B, as the relative difference |B−A| / max(|A|, |B|): "
        f"the first step it passes the tolerance ({result.tolerance:g}), its largest difference, and its "
        "difference at the first divergence. Per step below: the same for the loss, the global norm, the "
        "learning rates and every logged number."
    )
    paged_table(run_module_rows(result.modules), key="cmp_run_modules", column_config=run_module_config())
    st.subheader("Per step")
    every = st.toggle("Every recorded number (learning rates, scale, logged scalars)", key="cmp_steps_all")
    columns, left_out = shown_step_columns(result, EVERY_NUMBER_SHOWN if every else 2)
    steps = result.steps[columns]
    if every and left_out > 0:
        st.caption(f"The first {EVERY_NUMBER_SHOWN} numbers; {left_out:,} more were compared and are not "
                   "shown (`python -m inspector compare A B --json FILE` writes every one).")
    paged_table(run_step_rows(steps), key="cmp_steps", column_config=run_step_config(steps))


def pick_run(side: str, col) -> object | None:
    upload = col.file_uploader(f"Run {side} (upload)", key=f"cmp_run_upload_{side}")
    path = col.text_input(f"…or run {side} as a path under the runs folders", key=f"cmp_run_path_{side}",
                          value=st.query_params.get(f"run_{side.lower()}", ""))
    picked = pick_from_folders(f"cmp_pick_{side}", f"…or run {side} by name", col=col)
    if upload is not None:
        return parse_run_bytes(upload.getvalue(), upload.name)
    if picked:
        return read_run(picked)
    return read_run(checked_path(path.strip())) if path.strip() else None


def _two_runs() -> None:
    """Two run files side by side."""
    left, right = st.columns(2)
    with guarded("reading the run files"):
        run_a, run_b = pick_run("A", left), pick_run("B", right)
        tolerance = st.number_input(
            "Tolerance (relative; 0: any difference)", min_value=0.0, value=DEFAULT_TOLERANCE,
            step=1e-6, format="%g", key="cmp_tol"
        )
        if run_a is None or run_b is None:
            st.info("Choose two run files.")
        else:
            with request_budget("comparing the two runs"):
                result = compare_runs(run_a, run_b, tolerance=float(tolerance))
            show_runs(result, (run_a, run_b))
        overlay_runs("cmp_overlay")


def _weights(loaded: LoadedModel) -> None:
    """The loaded model (A) against B, tensor by tensor."""
    with guarded("comparing"):
        b = pick_b()
        if b is None:
            st.info(
                f"A is **{markdown_text(loaded.name)}**. Give B: another source, a checkpoint file or folder."
            )
            return
        with loaded.lock:
            result = cached_analysis(compare, loaded, b, device=str(loaded.device), cache_scope="session",
                                     cache_key=file_stamp(b))
        if not isinstance(result, WeightComparison):
            raise InspectorError(f"{b} is a run file; choose 'two run files' above to compare runs")
        st.caption(
            f"A: {markdown_text(result.a)} ({result.a_kind}) · B: {markdown_text(result.b)} ({result.b_kind})"
        )
        show_weights(result)


def main() -> None:
    st.set_page_config(page_title="Compare", layout="wide")
    loaded, mode = _header()
    if mode == "two run files":
        _two_runs()
        return
    if loaded is None:
        st.info("Pick a model in the sidebar: it is A.")
        return
    _weights(loaded)


main()
