"""A kept step replayed in the dashboard.

On the Training page (:func:`replay_part`) each error finding at a step the watch kept (``keep=True``) gets
"Replay this step": the Hook captures page opens at ``?run=PATH&step=N&replay=1`` and there
(:func:`replayed_section`) the step runs again on the model loaded in the sidebar
(:func:`inspector.replay`) and shows as "Step N, replayed": reproduced or not, the op table (first culprit
on top, with its file:line), every module's output with its NaN/Inf cells marked, the producer's inputs
and the gradients. The same address opens it from a link. A page run on its own (no navigation to switch
to) shows the replay where it is."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import streamlit as st
from streamlit.errors import StreamlitAPIException

from inspector import LoadedModel, Replay, replay
from inspector.figures import capture_heatmap
from inspector.replaying import kept_steps
from inspector.utils import markdown_code, markdown_text
from ui.errors import guarded
from ui.run_captures import stats_layout
from ui.tables import show_frame

HOOK_CAPTURES = "pages/4_Hook_captures.py"
STORED = "replayed"  # this browser session's last replay: (run, step, model, Replay); one is kept
ASKED = "replay_asked"  # the step a "Replay this step" button asked for: (run, step)
OP_COLUMNS = ["phase", "op", "module", "line", "code", "inputs", "nan", "inf"]
STAT_COLUMNS = ["module", "kind", "path", "shape", "dtype", "nan", "inf", "min", "max"]
MARK = "NaN/Inf"  # the ``marked`` column of a row whose tensor holds NaN or Inf


# -- data (no drawing) ---------------------------------------------------------------------------
def producer(r: Replay) -> str | None:
    """The module whose inputs the view shows: the one whose forward made the first NaN/Inf (its inputs
    were finite), else the first module whose output holds NaN/Inf; None when no output does."""
    first = r.first_in("forward")
    if first is not None and first.module in r.captures.inputs:
        return first.module
    bad = r.captures.stats
    bad = bad[(bad["kind"] == "output") & ((bad["nan"] > 0) | (bad["inf"] > 0))]
    return str(bad["module"].iloc[0]) if len(bad) else None


def replay_tables(r: Replay) -> dict[str, pd.DataFrame]:
    """What the view shows of a replay, as frames: ``ops`` (first culprit on top), ``outputs`` (each module's
    output as replayed, in the order they ran, a ``marked`` column saying NaN/Inf), ``inputs`` (the
    producer's inputs, the same columns), ``gradients`` (NaN/Inf first, then the largest)."""
    ops = pd.DataFrame([(o.phase, o.op, o.module, o.source, o.code, "; ".join(i.text() for i in o.inputs),
                         o.nan, o.inf) for o in r.ops], columns=OP_COLUMNS)
    grads = r.gradients[["name", "norm", "state"]].copy()
    grads["bad"] = grads["state"] == "nonfinite"
    grads = grads.sort_values(["bad", "norm"], ascending=[False, False]).drop(columns="bad")
    stats = r.captures.stats
    stats = stats[[c for c in STAT_COLUMNS if c in stats]].copy()
    bad = zip(stats["nan"], stats["inf"], strict=True)
    stats.insert(0, "marked", [MARK if n or i else "" for n, i in bad])
    name = producer(r)
    inputs = stats[(stats["kind"] == "input") & (stats["module"] == name)]
    return {"ops": ops, "outputs": stats[stats["kind"] == "output"].reset_index(drop=True),
            "inputs": inputs.reset_index(drop=True), "gradients": grads.reset_index(drop=True)}


def _rank(f: Any) -> int:
    return int(getattr(f, "rank", None) or 0)  # a finding about the whole world: rank 0's kept step


def replayable(kept: set[tuple[int, int]], findings: Sequence[Any]) -> list[Any]:
    """The run's findings that a replay explains: each error (and ``exploding-gradient``, which the watch
    keeps its step for) at a step its rank kept (``kept``: ``(step, rank)`` pairs), in the run's order."""
    return [f for f in findings
            if (f.step, _rank(f)) in kept and (f.severity == "error" or f.code == "exploding-gradient")]


def replay_address(run: str, step: int, rank: int = 0) -> dict[str, str]:
    """The Hook captures page's address that opens step ``step`` of ``run`` (``rank``'s) replayed."""
    return {"run": run, "step": str(step), "replay": "1", **({"rank": str(rank)} if rank else {})}


# -- the Training page ---------------------------------------------------------------------------
def replay_part(run_path: str, loaded: LoadedModel | None, findings: Sequence[Any] = ()) -> None:
    """The run's error findings at kept steps, each with "Replay this step" (the Hook captures page opens
    with the step replayed). ``findings``: the run's."""
    ranks = sorted({0} | {_rank(f) for f in findings})
    kept = {(s, r) for r in ranks for s in (kept_steps(run_path, r) if run_path else [])}
    if not kept:
        return
    several = len(ranks) > 1
    st.subheader("Replay a kept step")
    st.caption("The watch kept these steps (`keep=True`) with the weights their forward used. Replaying "
               "one runs it again on the model loaded in the sidebar, on the Hook captures page: whether the "
               "loss comes back bit for bit, the op, module and line that made the first NaN/Inf, every "
               "module's output.")
    rows = replayable(kept, findings)
    shown = {(f.step, _rank(f)) for f in rows}
    for i, f in enumerate(rows):
        left, right = st.columns([6, 1], vertical_alignment="center")
        on = f" on rank {_rank(f)}" if several else ""
        left.markdown(f"step {f.step:,}{on} · **{markdown_text(f.code)}** at {markdown_code(f.where)} — "
                      f"{markdown_text(f.message)}")
        right.button("Replay this step", key=f"train_replay_{i}", on_click=_ask,
                     args=(run_path, f.step, _rank(f)), type="primary" if i == 0 else "secondary")
    others = sorted(k for k in kept if k not in shown)  # kept with no error of their own (the step before)
    if others:
        st.caption("Also kept: " + ", ".join(f"step {s:,}" + (f" (rank {r})" if several else "")
                                              for s, r in others))
        for s, r in others:
            st.button(f"Replay step {s:,}" + (f" of rank {r}" if several else ""),
                      key=f"train_replay_step_{s}_{r}", on_click=_ask, args=(run_path, s, r))
    asked = st.session_state.pop(ASKED, None)
    if asked is None and st.query_params.get("replay") == "1":  # the Training page's address asks too
        step, rank = str(st.query_params.get("step", "")), str(st.query_params.get("rank", "0"))
        wanted = (int(step), int(rank)) if step.isdigit() and rank.isdigit() else None
        asked = (run_path, *wanted) if wanted in kept else None
    if asked is not None and asked[0] == run_path:
        open_replayed(asked[0], asked[1], loaded, asked[2])


def _ask(run: str, step: int, rank: int = 0) -> None:
    st.session_state[ASKED] = (run, step, rank)


def open_replayed(run: str, step: int, loaded: LoadedModel | None, rank: int = 0) -> None:
    """Go to the Hook captures page with step ``step`` of ``run`` (``rank``'s) replayed; a page that runs
    on its own (no navigation to switch to) shows the replay where it is."""
    try:
        st.switch_page(HOOK_CAPTURES, query_params=replay_address(run, step, rank))
    except StreamlitAPIException:  # not in the app's navigation: this page was run by itself
        with guarded("replaying the step"):
            show_replayed(run, step, loaded, rank)


# -- the Hook captures page ----------------------------------------------------------------------
def replayed_section(loaded: LoadedModel | None) -> None:
    """When the address asks for it (``?run=PATH&step=N&replay=1``): step N of the run, replayed on the
    sidebar's model. The run must lie under the runs folders (or be this session's upload)."""
    params = st.query_params
    if params.get("replay") != "1":
        return
    from ui.runs import checked_path

    with guarded("replaying the step"):
        run, step = str(params.get("run", "")), str(params.get("step", ""))
        rank = str(params.get("rank", "0"))
        for name, value in (("step", step), ("rank", rank)):
            if not value.strip().isdigit():
                st.warning(f"The address's {name}={markdown_text(value)} is no {name} number: nothing was "
                           "replayed.")
                return
        show_replayed(checked_path(run), int(step), loaded, int(rank))


def show_replayed(run: str, step: int, loaded: LoadedModel | None, rank: int = 0) -> None:
    """Step ``step`` of ``run`` (as ``rank`` kept it) replayed on ``loaded`` (once per browser session and
    model: the result is kept), drawn."""
    if loaded is None:
        st.subheader(f"Step {step:,}, replayed")
        st.info("Load the model this run trained in the sidebar to replay the step.")
        return
    stored: Any = st.session_state.get(STORED)
    key = (run, step, rank, id(loaded.model))
    if stored is None or stored[:4] != key:
        with st.spinner(f"Replaying step {step:,}…"), loaded.lock:
            stored = (*key, replay(run, step, loaded, rank=rank))
        st.session_state[STORED] = stored
    draw_replay(stored[4])


def draw_replay(r: Replay) -> None:
    """"Step N, replayed": reproduced or not, the ops, the module outputs (NaN/Inf marked), the producer's
    inputs, the gradients."""
    st.subheader(f"Step {r.step:,}, replayed", anchor="replayed")
    (st.success if r.reproduced else st.warning)(markdown_text(r.verdict()))  # names, paths: no Markdown
    c1, c2, c3 = st.columns(3)
    c1.metric("Reproduced", {True: "yes", False: "no", None: "no loss"}[r.reproduced],
              help="The replayed loss against the one the run recorded: bit for bit on the CPU, within "
                   f"{r.tolerance:g} (relative) on a GPU")
    c2.metric("Loss, replayed", "-" if r.loss is None else f"{r.loss:.6g}")
    c3.metric("Loss, recorded", "-" if r.recorded_loss is None else f"{r.recorded_loss:.6g}")
    tables = replay_tables(r)
    if len(tables["ops"]):
        st.caption("Ops that made NaN/Inf from finite inputs, first culprit on top")
        show_frame(tables["ops"], more_key="replayed_ops_more", first=["op", "module", "line"])
    for note in r.notes:
        st.caption(markdown_text(note))
    outputs = tables["outputs"]
    st.caption("Module outputs as replayed, in the order they ran (NaN/Inf marked)")
    show_frame(outputs.head(200), more_key="replayed_outputs_more", first=["marked", "module", "nan", "inf"],
               **_layout(outputs))
    name = producer(r)
    modules = [m for m in r.captures.order if m in r.captures.outputs]
    if modules:
        shown = st.selectbox("Module output", modules, index=modules.index(name) if name in modules else 0,
                             key="replayed_module")
        st.plotly_chart(capture_heatmap(r.captures.outputs[shown], title=f"{shown}: output, NaN/Inf cells "
                                        "marked"), key="replayed_heatmap")
    if name is not None and len(tables["inputs"]):
        st.caption(f"Inputs of {markdown_code(name)}, the module that made the first NaN/Inf")
        show_frame(tables["inputs"], **_layout(tables["inputs"]))
    st.caption(f"Gradients at step {r.step:,}: NaN/Inf first, then the largest")
    show_frame(tables["gradients"].head(50))


def _layout(stats: pd.DataFrame) -> dict[str, Any]:
    config = stats_layout(stats)["column_config"]
    config["marked"] = st.column_config.TextColumn("marked", help="The tensor holds NaN or Inf")
    return {"column_config": config}
