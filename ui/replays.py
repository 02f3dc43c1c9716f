"""The Training page's replay part: the steps a run kept (``watch(..., keep=True)``), one of them run again on
the model loaded in the sidebar (:func:`inspector.replay`), its ops, gradients and module outputs.

``?run=PATH&step=N&replay=1`` opens the page with step N replayed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import streamlit as st

from inspector import LoadedModel, Replay, replay
from inspector.replaying import kept_steps
from inspector.utils import markdown_text
from ui.errors import guarded
from ui.tables import show_frame

OP_COLUMNS = ["phase", "op", "module", "line", "code", "inputs", "nan", "inf"]


def replay_tables(r: Replay) -> dict[str, pd.DataFrame]:
    """What the part shows of a replay, as frames: ``ops`` (first culprit on top), ``gradients`` (NaN/Inf
    first, then the largest), ``outputs`` (each module's output and inputs as replayed)."""
    ops = pd.DataFrame([(o.phase, o.op, o.module, o.source, o.code, "; ".join(i.text() for i in o.inputs),
                         o.nan, o.inf) for o in r.ops], columns=OP_COLUMNS)
    grads = r.gradients[["name", "norm", "state"]].copy()
    grads["bad"] = grads["state"] == "nonfinite"
    grads = grads.sort_values(["bad", "norm"], ascending=[False, False]).drop(columns="bad")
    stats = r.captures.stats
    columns = ["module", "kind", "path", "shape", "dtype", "min", "max", "nan", "inf"]
    return {"ops": ops, "gradients": grads.reset_index(drop=True),
            "outputs": stats[[c for c in columns if c in stats]].reset_index(drop=True)}


def _asked_step(steps: list[int]) -> int:
    """The step the address names (``step=N``), when kept; else the first kept."""
    try:
        asked = int(st.query_params.get("step", ""))
    except ValueError:
        asked = -1
    return steps.index(asked) if asked in steps else 0


def step_labels(steps: list[int], findings: Sequence[Any]) -> dict[int, str]:
    """Each kept step as the picker shows it: the step and the error findings that began there."""
    out = {}
    for s in steps:
        codes = [f"{f.code} at {f.where}" for f in findings if f.step == s and f.severity == "error"]
        more = ", ..." if len(codes) > 3 else ""
        out[s] = f"step {s:,}" + (f": {', '.join(codes[:3])}{more}" if codes else "")
    return out


def replay_part(run_path: str, loaded: LoadedModel | None, findings: Sequence[Any] = ()) -> None:
    """The kept steps of the run at ``run_path`` (a file on the server), and the one replayed; ``findings``:
    the run's, to label each step with what it found."""
    steps = kept_steps(run_path) if run_path else []
    if not steps:
        return
    st.subheader("Replay a kept step")
    st.caption("The watch kept these steps (`keep=True`) with the weights their forward used. Replaying "
               "one runs it again on the model loaded in the sidebar: whether the loss comes back bit for "
               "bit, the op, module and line that made the first NaN/Inf, every module's output.")
    if loaded is None:
        st.info("Load the model this run trained in the sidebar to replay a step.")
        return
    labels = step_labels(steps, findings)
    step = st.selectbox("Kept step", steps, index=_asked_step(steps), key="train_replay_step",
                        format_func=labels.get)
    asked = st.query_params.get("replay") == "1" and st.query_params.get("step") == str(step)
    stored: Any = st.session_state.get("train_replayed")
    if st.button("Replay this step", key="train_replay") or (asked and stored is None):
        with guarded("replaying the step"), loaded.lock:
            stored = (run_path, step, replay(run_path, step, loaded))
            st.session_state["train_replayed"] = stored
    if stored is not None and stored[0] == run_path and stored[1] == step:
        _draw(stored[2])


def _draw(r: Replay) -> None:
    st.markdown(f"#### Step {r.step:,}, replayed")
    (st.success if r.reproduced else st.warning)(markdown_text(r.verdict()))  # names, paths: no Markdown
    tables = replay_tables(r)
    if len(tables["ops"]):
        st.caption("Ops that made NaN/Inf from finite inputs, first culprit on top")
        show_frame(tables["ops"], more_key="train_replay_ops_more", first=["op", "module", "line"])
    for note in r.notes:
        st.caption(markdown_text(note))
    st.caption(f"Gradients at step {r.step:,}: NaN/Inf first, then the largest")
    show_frame(tables["gradients"].head(50))
    st.caption("Module outputs and inputs, as replayed")
    show_frame(tables["outputs"].head(200), more_key="train_replay_outputs_more",
               first=["module", "nan", "inf"])
