"""The output files of the command line: only regular files are opened, and opening never blocks."""

from __future__ import annotations

import os

import pytest

from inspector import InspectorError
from inspector.commands.argtypes import open_output


def test_open_output_refuses_a_fifo_at_once(tmp_path):
    os.mkfifo(tmp_path / "pipe")  # a named pipe: opening it to write would wait for a reader forever
    with pytest.raises(InspectorError, match="not a regular file"):
        open_output(tmp_path / "pipe")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]
