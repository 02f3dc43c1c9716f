"""The Distributed page: a run file by server path or upload; figures, findings, one rank's view."""

from __future__ import annotations

from inspector.escaping import markdown_text
from tests.apptest import run_page


def test_page_shows_the_planted_faults_of_a_two_rank_run(world2):
    out, _ = world2
    at = run_page("8_Distributed.py", query={"run": str(out / "planted.jsonl")})
    assert not at.error, [e.value for e in at.error]
    assert [m.value for m in at.metric] == ["2", "gloo", "2", "2"]
    charts = at.get("plotly_chart")
    assert len(charts) == 2
    at.selectbox(key="dist_rank").set_value(1).run()
    assert not at.exception
    assert at.warning[0].value == "Rank 1 stands out at 2 (step, tensor) places."
    issues = at.dataframe[-3].value  # findings steps, issues, the rank's rows, tensors
    assert issues[["step", "tensor", "issue"]].values.tolist() == [
        [1, "blocks.0.fc1.weight", "nonfinite gradient"], [2, "scale", "differs from its replicas"]]
    at.selectbox(key="dist_rank").set_value(0).run()
    assert at.success[-1].value.startswith("Rank 0 agrees with its replicas")


def test_page_says_what_is_wrong_with_a_file_that_is_no_run(tmp_path):
    bad = tmp_path / "notes.jsonl"
    bad.write_text('{"step": 1}\n', encoding="utf-8")
    at = run_page("8_Distributed.py", query={"run": str(bad)})
    assert [e.value for e in at.error] == [markdown_text(  # errors are shown as escaped Markdown
        'notes.jsonl line 1 is not a check_step record (no "format": "inspector-distributed")')]
    missing = run_page("8_Distributed.py", query={"run": str(tmp_path / "none.jsonl")})
    assert "does not exist" in missing.error[0].value


def test_sidebar_lists_and_loads_a_distributed_checkpoint_folder(world2):
    from pathlib import Path

    from streamlit.testing.v1 import AppTest

    from tests.apptest import PAGES
    from ui.models import Selection

    out, _ = world2
    source = str(Path(__file__).resolve().parent.parent / "sample_models" / "fsdp.py") + ":build"
    at = AppTest.from_file(str(PAGES / "8_Distributed.py"), default_timeout=60)
    at.session_state["mi_selection"] = Selection(source=source, checkpoint=str(out / "dcp"))
    at.run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    captions = [c.value for c in at.sidebar.caption]
    assert "Distributed checkpoint: 19 entries in 37 pieces" in captions
    listing = at.sidebar.dataframe[0].value
    assert listing.set_index("name").loc["stem.weight", "pieces"] == "2"


def test_an_uploaded_run_file_is_shown_and_a_bad_one_is_named(world2):
    out, _ = world2
    at = run_page("8_Distributed.py")
    assert [i.value for i in at.info] == ["Choose a run file to see it."]
    data = (out / "planted.jsonl").read_bytes()
    at.file_uploader(key="dist_upload").upload("planted.jsonl", data).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert [m.value for m in at.metric] == ["2", "gloo", "2", "2"]
    at.selectbox(key="dist_rank").set_value(1).run()
    assert at.warning[0].value == "Rank 1 stands out at 2 (step, tensor) places."
    # the upload wins over a server path typed beside it; a file that is no run is named
    at.text_input(key="dist_path").set_value(str(out / "run.jsonl"))
    at.file_uploader(key="dist_upload").upload("notes.jsonl", b'{"step": 1}\n').run()
    assert not at.exception
    assert [e.value for e in at.error] == [markdown_text(
        'notes.jsonl line 1 is not a check_step record (no "format": "inspector-distributed")')]
    assert len(at.metric) == 0  # the page stops before the figures
