"""Distributed: one run of check_step under torchrun, merged over ranks: norms, memory, drift."""

from __future__ import annotations

import streamlit as st

from inspector import run_report
from inspector.distributed import parse_run, rank_issues, read_run, unique_findings
from inspector.escaping import markdown_text
from inspector.figures import grad_norm_figure, memory_figure
from ui.errors import guarded
from ui.sidebar import model_picker
from ui.tables import findings_table, paged_table

st.set_page_config(page_title="Distributed", layout="wide")
model_picker()

st.title("Distributed")
st.caption("Open the JSON-lines file that `inspector.distributed.check_step(model, step, 'run.jsonl')` writes "
           "from your own training loop, or that `torchrun --nproc-per-node 2 -m inspector distributed "
           "FILE.py:factory --shard fsdp --steps 3 -o run.jsonl` writes. Every line is one step, merged over "
           "the ranks: gradient norms of each rank's pieces, memory, and the findings — replicated tensors "
           "that drifted apart, nonfinite gradients by rank, a rank far off the others, shard imbalance.")

left, right = st.columns(2)
upload = left.file_uploader("Upload a run file (.jsonl)", type=["jsonl", "json", "txt"], key="dist_upload")
path = right.text_input("…or a path on the server", value=st.query_params.get("run", ""), key="dist_path",
                        placeholder="/path/to/run.jsonl")

run = None
with guarded("reading the run file"):
    if upload is not None:
        run = parse_run(upload.getvalue().decode("utf-8", errors="replace"), upload.name)
    elif path.strip():
        run = read_run(path.strip())
if run is None:
    st.info("Choose a run file to see it.")
    st.stop()

steps = run.steps["step"].tolist()
found = unique_findings(run)
c1, c2, c3, c4 = st.columns(4)
c1.metric("Ranks", run.world_size)
c2.metric("Backend", run.backend)
c3.metric("Steps", len(steps))
c4.metric("Findings", len(found))

st.subheader("Findings")
st.caption("Each finding once, with the steps it was seen at.")
findings_table([f for _, f in found], key="dist_findings", empty="No rank disagreed with the others.")
if found:
    st.dataframe([{"code": f.code, "where": f.where, "steps": ", ".join(map(str, s))} for s, f in found],
                 hide_index=True, width="stretch")

st.subheader("Gradient norm per rank")
st.caption("Each rank's line is the norm of the gradient pieces it holds; the dashed line is the global "
           "norm (what `clip_grad_norm_` returns). A gap in a rank's line is a step where its gradients "
           "were not finite.")
st.plotly_chart(grad_norm_figure(run.per_rank, run.steps), width="stretch")

st.subheader("Memory per rank")
step = st.select_slider("Step", options=steps, value=steps[-1], key="dist_step") if len(steps) > 1 else steps[0]
st.plotly_chart(memory_figure(run.per_rank, step), width="stretch")

st.subheader("One rank")
rank = st.selectbox("Rank", sorted(run.per_rank["rank"].unique().tolist()), key="dist_rank")
issues = rank_issues(run, int(rank))
if len(issues):
    st.warning(f"Rank {markdown_text(rank)} stands out at {len(issues)} (step, tensor) places.")
    st.dataframe(issues, hide_index=True, width="stretch")
else:
    st.success(f"Rank {markdown_text(rank)} agrees with its replicas and has finite gradients at every step.")
st.dataframe(run.per_rank[run.per_rank["rank"] == rank], hide_index=True, width="stretch")

st.subheader(f"Tensors at step {markdown_text(step)}")
paged_table(run.tensors_at(step).drop(columns=["mesh"]).astype(str), key="dist_tensors")

report = run_report(run)
st.download_button("Markdown report", report.to_markdown(), file_name="distributed-run.md", mime="text/markdown")
st.download_button("JSON report", report.to_json(), file_name="distributed-run.json", mime="application/json")
