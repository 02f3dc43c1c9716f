"""Training: a run file (inspector.watch's, or check_step's) followed live: norms per
module and step, loss, findings on a timeline, one step's modules, and the ranks side by side."""

from __future__ import annotations

from typing import Any

import streamlit as st

from inspector import run_report
from inspector.figures import norm_heatmap
from inspector.utils import markdown_text
from inspector.watching import first_producer
from ui.errors import guarded
from ui.replays import replay_part
from ui.report_downloads import report_downloads
from ui.runs import overlay_runs, pick_from_folders
from ui.sidebar import model_picker
from ui.training import (
    Opened,
    available_columns,
    column_label,
    distributed_part,
    file_key,
    loss_figure_of,
    nearest_step,
    norm_grid_of,
    open_run,
    picked_step,
    rank_steps,
    run_ranks,
    step_part,
    watch_file,
    watch_ranks_part,
)
from ui.training_findings import apply_address, keep_address, show_findings, show_verdict

REFRESH_S = 3


def _header() -> None:
    """Title and what a run file is."""
    st.title("Training")
    st.caption(
        "Open the file `with inspector.watch(model, optimizer, 'run.inspect'):` writes around your own loop "
        "(or `python -m inspector watch`), or the one `inspector.distributed.check_step` / "
        "`torchrun ... -m inspector distributed` writes (an older `run.jsonl` too). A file on the server is "
        "read again every few seconds while it grows: gradient norms of every module at every step, the "
        "loss, each finding at the step it appeared, one step's modules, and the ranks side by side."
    )


def _source() -> tuple[Any, str, bool]:
    """Where the run file comes from: an upload, or a path on the server (followed while it grows)."""
    left, right = st.columns(2)
    upload = left.file_uploader(
        "Upload a run file (.inspect or .jsonl)",
        type=["inspect", "arrow", "jsonl", "json", "txt"],
        key="train_upload",
    )
    path = right.text_input(
        "…or a path under the runs folders",
        value=st.query_params.get("run", ""),
        key="train_path",
        placeholder="/path/to/run.inspect",
    )
    picked = pick_from_folders("train_pick", col=left)
    path = picked or path
    follow = right.toggle(
        f"Follow the file while it grows (every {REFRESH_S} s)",
        value=True,
        key="train_follow",
        disabled=upload is not None,
        help="An upload is a copy: it does not grow.",
    )
    return upload, path, follow


def _overview(opened: Opened) -> tuple[int, Any]:
    """Which rank, the run in numbers, and its findings; returns the rank and its steps."""
    run = opened.run
    ranks = run_ranks(opened)
    rank = st.selectbox("Rank", ranks, key="train_rank") if len(ranks) > 1 else ranks[0]
    steps = rank_steps(run, rank)
    cols = st.columns(5)
    cols[0].metric("Steps", f"{len(steps):,}")
    cols[1].metric("Last step", f"{int(steps[-1]):,}")
    cols[2].metric("Modules", f"{len(run.module_order):,}")
    cols[3].metric("Ranks", run.world_size)
    cols[4].metric("Findings", f"{len(run.findings):,}")
    state = ("Complete: the run ended and closed its file; the page no longer follows it." if run.complete
             else "Still being written (or its writer stopped): every complete step is shown.")
    st.caption(f"{state} Read {markdown_text(run.path)}.")
    show_findings(opened)
    return rank, steps


def _norms(opened: Opened, rank: int, steps: Any) -> int:
    """Norms per module and step, and the loss; returns the step picked."""
    run = opened.run
    st.subheader("Norms per module, over steps")
    st.session_state.setdefault("train_latest", True)  # an address or a button may have set it already
    latest = st.checkbox("Follow the latest step", key="train_latest")
    if latest or "train_step" not in st.session_state:
        st.session_state["train_step"] = int(steps[-1])
    wanted = st.number_input(
        "Step",
        step=1,
        key="train_step",
        disabled=latest,
        help="The step of the table below and of the dotted line; the nearest recorded step is shown.",
    )
    step = nearest_step(steps, int(wanted))
    keep_address(None if latest else step)
    column = st.radio("Per module", available_columns(run), horizontal=True, key="train_column",
                      format_func=column_label)
    grid = norm_grid_of(opened, opened.key, column, rank)
    heat = norm_heatmap(grid, title=f"{column_label(column)} per module and step",
                        producer=first_producer(run))
    heat.add_vline(x=step, line={"color": "#D62728", "width": 1, "dash": "dot"})
    st.plotly_chart(heat, width="stretch")
    st.caption("One row per module that holds parameters; a module without any (an activation, a gate with "
               "only buffers) has no norm of its own, though a finding may name it.")
    st.plotly_chart(loss_figure_of(opened, opened.key), width="stretch")
    return step


def _show(opened: Opened, loaded: Any = None) -> None:
    """Everything about one opened run: the verdict, the step picked right under it (a button, a
    finding or the address took the page there), then the run, its norms and its ranks (``loaded``: the
    sidebar's model, which a kept step replays on)."""
    run = opened.run
    apply_address(opened)
    show_verdict(opened)
    ranks = run_ranks(opened)
    wanted_rank = st.session_state.get("train_rank")
    picked = picked_step(opened, wanted_rank if wanted_rank in ranks else ranks[0])
    if picked is not None:
        step_part(opened, picked, wanted_rank if wanted_rank in ranks else ranks[0])
    rank, steps = _overview(opened)
    step = _norms(opened, rank, steps)
    if picked is None:
        step_part(opened, step, rank)

    if run.kind == "check":
        distributed_part(run, step, rank)
    elif run.world_size > 1:
        watch_ranks_part(run, step)
    if run.kind == "watch" and run.source:
        with guarded("listing the kept steps"):
            replay_part(run.source, loaded, run.findings)
    st.subheader("Run report")
    st.caption("The run as one file to share: its verdict and findings, the figures above and the modules at "
               "its first error's step. Each file is made when its button is pressed.")
    stem = "distributed-run" if run.kind == "check" else "run"
    report_downloads(lambda: run_report(run), stem, "train_report")


def live(upload: Any, path: str, loaded: Any = None) -> None:
    """The run file (read again only when it changed), on every run of this fragment; notes whether
    it is complete, which ends the following."""
    opened, failed = None, True
    with guarded("reading the run file"):
        opened, failed = open_run(upload, path), False
    st.session_state["train_complete"] = path if opened is not None and opened.run.complete else None
    if failed:
        return
    if opened is None:
        st.info("Choose a run file to see it.")
        return
    if not len(opened.run.steps):  # only the header: the run started and has not finished a step
        st.info(markdown_text(f"{opened.run.path}: 0 steps so far (the run has written its header and no "
                              "whole step)."))
        return
    with guarded("showing the run"):
        _show(opened, loaded)


def main() -> None:
    st.set_page_config(page_title="Training", layout="wide")
    loaded = model_picker()
    _header()
    upload, path, follow = _source()
    following = follow and upload is None and bool(path.strip())
    seen = file_key(path) if following else None  # before the read: a write after it is caught
    st.fragment(live)(upload, path, loaded)
    if following and st.session_state.get("train_complete") != path:  # a complete run is followed no more
        st.fragment(watch_file, run_every=REFRESH_S)(path, seen)
    with guarded("overlaying runs"):
        overlay_runs("train_overlay")


main()
