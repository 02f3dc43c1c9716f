"""The output files of the command line: only regular files are opened, and opening never blocks."""

from __future__ import annotations

import os

from safetensors.torch import save_file
from torch import zeros

from inspector.__main__ import main


def test_an_output_file_that_is_a_fifo_is_refused_at_once(tmp_path, capsys):
    save_file({"w": zeros(2)}, str(tmp_path / "a.safetensors"))
    os.mkfifo(tmp_path / "pipe")  # a named pipe: opening it to write would wait for a reader forever
    assert main(["checkpoint", str(tmp_path / "a.safetensors"), "--json", str(tmp_path / "pipe")]) == 2
    assert "not a regular file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.safetensors", "pipe"]
