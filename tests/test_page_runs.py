"""The runs folders on the Training and Compare pages (AppTest): listed, picked by name, overlaid,
and every typed path or address that leads out of them refused with a message naming ``--runs``."""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.apptest import run_page
from tests.test_runfolders import write_run


@pytest.fixture
def runs(tmp_path, monkeypatch):
    root = tmp_path / "runs"
    write_run(root / "exp" / "old.inspect", steps=2)
    write_run(root / "exp" / "new.inspect", steps=3, poison=1)
    os.utime(root / "exp" / "old.inspect", (time.time() - 600, time.time() - 600))
    write_run(tmp_path / "elsewhere" / "secret.inspect")
    (root / "out.inspect").symlink_to(tmp_path / "elsewhere" / "secret.inspect")
    monkeypatch.setenv("INSPECTOR_RUNS", str(root))
    return root


def _snapshot(root):
    return sorted((str(p), p.stat().st_size) for p in root.rglob("*") if not p.is_symlink())


def test_runs_are_listed_newest_first_and_open_by_name(runs):
    before = _snapshot(runs)
    at = run_page("8_Training.py")
    pick = at.selectbox(key="train_pick")
    assert pick.options == ["exp/new.inspect", "exp/old.inspect"]  # newest first, neither live
    table = at.dataframe[0].value
    assert table["run"].tolist() == ["exp/new.inspect", "exp/old.inspect"]
    assert table["first finding"].iloc[0].startswith("step 1: ") and table["first finding"].iloc[1] == ""
    pick.set_value("exp/new.inspect").run()
    assert not at.exception
    assert {m.label: m.value for m in at.metric}["Steps"] == "3"
    assert _snapshot(runs) == before  # the page wrote nothing into the runs folder


def test_two_runs_overlay_on_the_loss_and_norm_lines(runs):
    at = run_page("8_Training.py")
    at.multiselect(key="train_overlay").set_value(["exp/new.inspect", "exp/old.inspect"]).run()
    assert not at.exception
    fig = json.loads(at.get("plotly_chart")[-1].proto.spec)
    names = {t["name"] for t in fig["data"]}
    assert names == {"exp/new.inspect", "exp/old.inspect"}


@pytest.mark.parametrize("typed", ["/etc/passwd", "/proc/self/environ", "../elsewhere/secret.inspect",
                                   "exp/../../elsewhere/secret.inspect", "out.inspect"])
def test_a_path_out_of_the_runs_folders_is_refused_naming_the_flag(runs, typed):
    at = run_page("8_Training.py", query={"run": typed})
    errors = [e.value for e in at.error]
    assert any("--runs" in e and "INSPECTOR_RUNS" in e for e in errors), errors
    assert not at.metric  # nothing of the file shown
    cmp = run_page("9_Compare.py", query={"run_a": typed, "run_b": "exp/new.inspect"})
    cmp.radio(key="cmp_mode").set_value("two run files").run()
    assert any("--runs" in e.value for e in cmp.error)


def test_without_runs_folders_every_typed_path_is_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("INSPECTOR_RUNS", raising=False)
    path = write_run(tmp_path / "r.inspect")
    at = run_page("8_Training.py", query={"run": str(path)})
    assert any("none is configured" in e.value and "--runs" in e.value for e in at.error)
    assert any("--runs" in c.value for c in at.caption)


def test_a_run_inside_opens_by_its_typed_path(runs):
    at = run_page("8_Training.py", query={"run": "exp/old.inspect"})
    assert not at.error and {m.label: m.value for m in at.metric}["Steps"] == "2"


def test_a_run_being_written_is_marked_live(runs):
    import torch
    from torch import nn

    from inspector import watch

    m = nn.Linear(2, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with watch(m, opt, runs / "now.inspect"):
        m(torch.ones(1, 2)).sum().backward()
        opt.step()
        at = run_page("8_Training.py")
        assert at.selectbox(key="train_pick").options[0] == "● live · now.inspect"
        assert at.dataframe[0].value["state"].tolist() == ["● live", "complete", "complete"]


def test_compare_takes_both_runs_by_name(runs):
    at = run_page("9_Compare.py")
    at.radio(key="cmp_mode").set_value("two run files").run()
    at.selectbox(key="cmp_pick_A").set_value("exp/old.inspect")
    at.selectbox(key="cmp_pick_B").set_value("exp/new.inspect").run()
    assert not at.exception and not at.error
    assert "Per module" in [s.value for s in at.subheader]


def test_a_runs_folder_gone_since_the_start_is_named_and_the_page_goes_on(runs, tmp_path, monkeypatch):
    monkeypatch.setenv("INSPECTOR_RUNS", f"{runs},{tmp_path / 'removed'}")
    at = run_page("8_Training.py")
    assert not at.exception
    assert any("removed" in e.value for e in at.error), [e.value for e in at.error]
    assert at.file_uploader  # the page still offers an upload


def test_another_sessions_upload_folder_is_not_a_runs_folder(runs):
    from ui.uploads import upload_dir

    other = upload_dir() / "1-another-session" / "their.inspect"
    at = run_page("8_Training.py", query={"run": str(other)})
    assert any("--runs" in e.value for e in at.error), [e.value for e in at.error]
