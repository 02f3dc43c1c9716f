"""The per-rank part of the Training page on check_step run files: the planted faults of a real
two-rank run, a hand-planted ``--shard none`` run, readable units, and errors that name the file."""

from __future__ import annotations

import json

import pytest

from inspector.distributed import read_run
from inspector.utils import markdown_text
from tests.apptest import run_page


@pytest.fixture(autouse=True)
def _runs_under_tmp(tmp_path_factory, monkeypatch):
    """The server opens typed run paths only under its runs folders: here, pytest's temporary folders."""
    monkeypatch.setenv("INSPECTOR_RUNS", str(tmp_path_factory.getbasetemp()))

MIB = 2 ** 20


def _issues(at):
    return next(d.value for d in at.dataframe if list(d.value.columns) == ["step", "tensor", "issue"])


def _rank_rows(at):
    return next(d for d in at.dataframe if "peak_rss" in d.value.columns)


def test_page_shows_the_planted_faults_of_a_two_rank_run(world2):
    out, _ = world2
    at = run_page("8_Training.py", query={"run": str(out / "planted.jsonl")})
    assert not at.error, [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    assert (metrics["Ranks"], metrics["Steps"], metrics["Findings"]) == ("2", "2", "2")
    at.selectbox(key="train_rank").set_value(1).run()
    assert not at.exception
    assert at.warning[0].value == "Rank 1 stands out at 2 (step, tensor) places."
    # two ranks whose buffer differs: no majority says which is right, so rank 0 is named too
    assert _issues(at).values.tolist() == [
        [1, "blocks.0.fc1.weight", "nonfinite gradient"], [2, "scale", "replicas disagree, no majority"]]
    at.selectbox(key="train_rank").set_value(0).run()
    assert at.warning[0].value == "Rank 0 stands out at 1 (step, tensor) places."
    assert not [s for s in at.success if "agrees with its replicas" in s.value]


def test_peak_rss_is_never_below_rss_in_a_real_run(world2):
    out, _ = world2
    per_rank = read_run(out / "run.jsonl").per_rank
    assert per_rank["rss"].notna().all()
    assert (per_rank["peak_rss"] >= per_rank["rss"]).all(), per_rank[["rss", "peak_rss"]]


def _record(step: int) -> dict:
    """Two ranks of ``--shard none``: plain parameters (still equal) whose gradients were never averaged
    (rank 1's norms are twice rank 0's) and a BatchNorm buffer each rank updated on its own."""
    def tensor(name, kind, norms, hashes):
        return {
            "name": name,
            "kind": kind,
            "placements": "",
            "mesh": [],
            "shape": [4],
            "numel": 4,
            "dtype": "float32",
            "requires_grad": kind == "parameter",
            "has_grad": kind == "parameter",
            "local_numel": [4, 4],
            "grad_norm": None,
            "local_grad_norm": norms,
            "nan": [0, 0],
            "inf": [0, 0],
            "replica_key": [0, 0],
            "hash": hashes,
        }
    rec = {"format": "inspector-distributed", "version": 1, "step": step, "time": 0.0, "world_size": 2,
           "backend": "gloo", "note": "",
           "global": {"grad_norm": 1.2345678901234567, "nonfinite": 0, "param_numel": 8},
           "ranks": [{"rank": r, "grad_norm": [1.2345678901234567, 2.469135780246913][r], "nonfinite": 0,
                      "param_numel": 8, "param_bytes": 32, "grad_bytes": 32, "buffer_bytes": 2048,
                      "device_allocated": None, "device_peak": None, "rss": 512 * MIB, "peak_rss": 600 * MIB}
                     for r in (0, 1)],
           "tensors": [tensor("fc.weight", "parameter", [1.0, 2.0], [[1, 1], [1, 1]]),
                       tensor("fc.bias", "parameter", [0.5, 1.0], [[3, 3], [3, 3]]),
                       tensor("bn.running_mean", "buffer", [None, None], [[5, 5], [6, 6]])]}
    # what check_step finds in it, worked out by hand: rank 1's norms are twice rank 0's, its buffer differs
    rec["findings"] = [
        {"code": "gradient-not-synchronized", "severity": "warning", "where": name,
         "message": f"{name} is a plain parameter on every rank, but its gradient norm ranges from {lo:g} to "
                    f"{2 * lo:g} across ranks: its gradients are not averaged"}
        for name, lo in (("fc.weight", 1.0), ("fc.bias", 0.5))
    ] + [{"code": "replica-drift", "severity": "error", "where": "bn.running_mean",
          "message": f"buffer bn.running_mean should be identical on ranks 0 and 1 but at step {step} rank 1 "
                     "holds different values from rank 0"}]
    return rec


@pytest.fixture
def shard_none(tmp_path):
    path = tmp_path / "none.jsonl"
    path.write_text("".join(json.dumps(_record(s)) + "\n" for s in (0, 1)), encoding="utf-8")
    return path


def test_rank_0_of_a_shard_none_run_is_not_said_to_agree(shard_none):
    at = run_page("8_Training.py", query={"run": str(shard_none)})
    assert not at.error, [e.value for e in at.error]
    found = {m.label: m.value for m in at.metric}["Findings"]
    assert found == "6"  # per step: two gradient-not-synchronized, a replica-drift, (two steps)
    at.selectbox(key="train_rank").set_value(0).run()
    assert not [s for s in at.success if "agrees with its replicas" in s.value]
    # per step: two parameters whose gradients differ, one buffer whose replicas disagree
    assert at.warning[0].value == "Rank 0 stands out at 6 (step, tensor) places."
    assert _issues(at)[["tensor", "issue"]].values.tolist()[:3] == [
        ["fc.weight", "gradient not synchronized"], ["fc.bias", "gradient not synchronized"],
        ["bn.running_mean", "replicas disagree, no majority"]]


def test_rank_numbers_are_in_binary_units_and_four_digits(shard_none):
    at = run_page("8_Training.py", query={"run": str(shard_none)})
    rows = _rank_rows(at)
    assert (
        rows.value[["rss", "peak_rss", "buffer_bytes"]].values.tolist()
        == [["512.0 MiB", "600.0 MiB", "2.0 KiB"]] * 2
    )
    assert (
        '"%.4g"' in rows.proto.columns and "grad_norm" in rows.proto.columns
    )  # 1.235, not 1.2345678901234567
    memory = next(
        json.loads(c.proto.spec) for c in at.get("plotly_chart") if "Memory per rank" in c.proto.spec
    )
    assert memory["layout"]["yaxis"]["type"] == "log"
    assert memory["data"][0]["text"] == ["32 B", "32 B", "2.0 KiB", "512.0 MiB", "600.0 MiB"]


def test_page_says_what_is_wrong_with_a_file_that_is_no_run(tmp_path):
    bad = tmp_path / "notes.jsonl"
    bad.write_text('{"step": 1}\n', encoding="utf-8")
    at = run_page("8_Training.py", query={"run": str(bad)})
    assert [e.value for e in at.error] == [markdown_text(
        "notes.jsonl is neither a watch run file (Arrow stream) nor a check_step run.jsonl")]
    missing = run_page("8_Training.py", query={"run": str(tmp_path / "none.jsonl")})
    assert "does not exist" in missing.error[0].value


def test_sidebar_lists_and_loads_a_distributed_checkpoint_folder(world2):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from tests.apptest import PAGES
    from ui.models import Selection

    out, _ = world2
    source = str(Path(__file__).resolve().parents[1] / "sample_models" / "fsdp.py") + ":build"
    at = AppTest.from_file(str(PAGES / "8_Training.py"), default_timeout=60)
    at.session_state["mi_selection"] = Selection(source=source, checkpoint=str(out / "dcp"))
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    captions = [c.value for c in at.sidebar.caption]
    assert "Distributed checkpoint: 19 entries in 37 pieces" in captions
    listing = at.sidebar.dataframe[0].value
    assert listing.set_index("name").loc["stem.weight", "pieces"] == "2"


def test_an_uploaded_run_file_is_shown_and_a_bad_one_is_named(world2):
    out, _ = world2
    at = run_page("8_Training.py")
    assert [i.value for i in at.info] == ["Choose a run file to see it."]
    data = (out / "planted.jsonl").read_bytes()
    at.file_uploader(key="train_upload").upload("planted.jsonl", data).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert {m.label: m.value for m in at.metric}["Ranks"] == "2"
    at.selectbox(key="train_rank").set_value(1).run()
    assert at.warning[0].value == "Rank 1 stands out at 2 (step, tensor) places."
    # the upload wins over a server path typed beside it; a file that is no run is named
    at.text_input(key="train_path").set_value(str(out / "run.jsonl"))
    at.file_uploader(key="train_upload").upload("notes.jsonl", b'{"step": 1}\n').run()
    assert not at.exception
    assert [e.value for e in at.error] == [markdown_text(
        'notes.jsonl line 1 is not a check_step record (no "format": "inspector-distributed")')]
    assert len(at.metric) == 0  # the page stops before the figures


def test_the_per_rank_parts_are_data_built_without_a_page(shard_none, tmp_path):
    """What the per-rank parts show comes from one function each, drawn by another: the data here."""
    from inspector.watching import read_run as read_any
    from inspector.watching import synthetic_run
    from ui.training import check_ranks_view, watch_ranks_view

    view = check_ranks_view(read_any(shard_none), step=5, rank=1)  # step 5 is not there: the nearest, 1
    assert view.at == 1 and view.rank == 1
    assert view.findings.values.tolist() == [["gradient-not-synchronized", "fc.weight", "0, 1"],
                                             ["gradient-not-synchronized", "fc.bias", "0, 1"],
                                             ["replica-drift", "bn.running_mean", "0, 1"]]
    assert len(view.issues) == 6  # per step: two unsynchronized gradients and the drifting buffer
    assert view.rows[["step", "rss"]].values.tolist() == [[0, "512.0 MiB"], [1, "512.0 MiB"]]
    assert view.tensors["name"].tolist() == ["fc.weight", "fc.bias", "bn.running_mean"]
    assert view.memory.layout.title.text == "Memory per rank at step 1"

    synthetic_run(tmp_path / "two.inspect", steps=40, modules=6, world_size=2)
    watched = watch_ranks_view(read_any(tmp_path / "two.inspect"), step=17)
    assert watched.at == 17 and watched.memory is None  # synthetic runs record no memory
    assert watched.rows[["step", "rank"]].values.tolist() == [[17, 0], [17, 1]]
    assert [t.name for t in watched.norms.data] == ["rank 0", "rank 1"]
