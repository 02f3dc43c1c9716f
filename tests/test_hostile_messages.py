"""Messages that say what is wrong: a FIFO given to compare is a FIFO, a run file that is not there does
not exist, an empty upload is empty (each once told something else)."""

from __future__ import annotations

import os

import pytest

from inspector import InspectorError, compare
from inspector.__main__ import main
from inspector.watching import parse_run_bytes, synthetic_run


@pytest.fixture
def good(tmp_path):
    synthetic_run(tmp_path / "good.inspect", steps=3, modules=2)
    return tmp_path / "good.inspect"


def test_compare_names_a_fifo_as_a_fifo(good, tmp_path):
    os.mkfifo(tmp_path / "pipe.inspect")
    for a, b in ((good, tmp_path / "pipe.inspect"), (tmp_path / "pipe.inspect", good)):
        with pytest.raises(InspectorError, match=r"pipe.inspect is a FIFO \(named pipe\), not a regular"):
            compare(a, b)


def test_a_missing_run_file_does_not_exist(good, tmp_path, capsys):
    with pytest.raises(InspectorError, match=r"run file .*none.inspect does not exist"):
        compare(good, tmp_path / "none.inspect")
    assert main(["report", str(tmp_path / "no" / "run.inspect"), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert "run.inspect does not exist" in err and "cannot tell what kind of source" not in err


@pytest.mark.parametrize("data", [b"", b"  \n\n"])
def test_an_empty_upload_is_empty(data):
    with pytest.raises(InspectorError, match=r"up.inspect is empty( \(blank lines only\))?: upload"):
        parse_run_bytes(data, "up.inspect")
