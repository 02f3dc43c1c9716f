"""Runs folders: listing the runs under them, and refusing every path that leads elsewhere."""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch import nn

from inspector import InspectorError, watch
from inspector.runfolders import allowed_run_path, describe, list_runs, runs_dirs


def write_run(path, steps=2, poison=None):
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with watch(m, opt, path):
        for i in range(steps):
            x = torch.ones(1, 2)
            if i == poison:
                x[0, 0] = float("inf")
            m(x).sum().backward()
            opt.step()
            opt.zero_grad()
    return path


@pytest.fixture
def runs(tmp_path):
    root = tmp_path / "runs"
    write_run(root / "a" / "old.inspect")
    write_run(root / "b" / "bad.inspect", steps=3, poison=1)
    os.utime(root / "a" / "old.inspect", (time.time() - 3600, time.time() - 3600))
    (root / "notes.inspect").write_text("not a run")  # named like one, is not one
    return root


def test_runs_are_listed_newest_first_with_their_first_finding(runs):
    before = sorted(p for p in runs.rglob("*"))
    entries = list_runs([runs])
    assert [e.name for e in entries] == ["b/bad.inspect", "a/old.inspect"]
    assert not any(e.live for e in entries)  # both closed
    rows = [describe(e) for e in entries]
    assert rows[0]["steps"] == 3 and rows[0]["first finding"].startswith("step 1: ")
    assert rows[1]["first finding"] == "" and rows[1]["steps"] == 2
    assert sorted(p for p in runs.rglob("*")) == before  # listing wrote nothing


def test_a_run_still_being_written_is_live(tmp_path):
    root = tmp_path / "runs"
    m = nn.Linear(2, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    with watch(m, opt, root / "now.inspect"):
        m(torch.ones(1, 2)).sum().backward()
        opt.step()
        (entry,) = list_runs([root])
        assert entry.live and entry.label.startswith("● live")
        assert describe(entry)["steps"] == 1
    assert not list_runs([root])[0].live
    assert not list_runs([root], now=time.time() + 3600)[0].live


def test_several_folders_prefix_each_name_with_its_folder(tmp_path):
    write_run(tmp_path / "x" / "r.inspect")
    write_run(tmp_path / "y" / "r.inspect")
    dirs = runs_dirs(f"{tmp_path / 'x'},{tmp_path / 'y'}")
    assert sorted(e.name for e in list_runs(dirs)) == ["x/r.inspect", "y/r.inspect"]


def test_an_unknown_runs_folder_is_named(tmp_path):
    with pytest.raises(InspectorError, match=r"runs folder .*nowhere does not exist; give --runs"):
        runs_dirs(str(tmp_path / "nowhere"), check=True)


def test_symlinked_runs_are_not_listed(runs, tmp_path):
    outside = write_run(tmp_path / "elsewhere" / "secret.inspect")
    (runs / "link.inspect").symlink_to(outside)
    (runs / "linkdir").symlink_to(outside.parent, target_is_directory=True)
    assert "link.inspect" not in [e.name for e in list_runs([runs])]
    assert not [e for e in list_runs([runs]) if e.name.startswith("linkdir")]


@pytest.mark.parametrize("path", ["/etc/passwd", "/proc/self/environ", "../elsewhere/secret.inspect",
                                  "a/../../elsewhere/secret.inspect", "link.inspect",
                                  "linkdir/secret.inspect", "", "/"])
def test_paths_out_of_the_runs_folders_are_refused_naming_the_flag(runs, tmp_path, path):
    outside = write_run(tmp_path / "elsewhere" / "secret.inspect")
    (runs / "link.inspect").symlink_to(outside)
    (runs / "linkdir").symlink_to(outside.parent, target_is_directory=True)
    with pytest.raises(InspectorError, match=r"--runs DIR.*INSPECTOR_RUNS"):
        allowed_run_path(path, [runs])


def test_paths_inside_are_accepted_by_name_or_in_full(runs, tmp_path):
    assert allowed_run_path("b/bad.inspect", [runs]) == (runs / "b" / "bad.inspect").resolve()
    assert allowed_run_path(str(runs / "a" / "old.inspect"), [runs]) == (runs / "a" / "old.inspect").resolve()
    assert allowed_run_path("a/../b/bad.inspect", [runs]).name == "bad.inspect"
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    (uploads / "u.inspect").write_bytes(b"")
    assert allowed_run_path(str(uploads / "u.inspect"), [runs], extra=[uploads]).parent == uploads.resolve()
    with pytest.raises(InspectorError, match="none is configured"):
        allowed_run_path(str(runs / "a" / "old.inspect"), [])


def test_serve_refuses_an_unknown_runs_folder_before_starting(tmp_path, capsys):
    from inspector.__main__ import main

    assert main(["serve", "--runs", f"{tmp_path},{tmp_path / 'nowhere'}"]) == 2
    err = capsys.readouterr().err
    assert "nowhere does not exist" in err and "--runs" in err and "Traceback" not in err
