"""Names that carry terminal controls (ESC sequences, NUL) or bidirectional overrides (U+202E,
which shows ``evil\u202etxt-exe`` as ``evilexe-txt``) reach no terminal, report or figure raw:
each shows as a visible escape, and the JSON report still holds the exact name."""

from __future__ import annotations

import json

import pytest

from inspector import build_report, load_model
from inspector.__main__ import main

ESC, NUL, RLO = "\x1b[31mred", "nul\x00byte", "evil\u202etxt-exe"
RAW = ("\x1b", "\x00", "\u202e")

MODEL_FILE = f'''
from torch import nn


def build():
    net = nn.Sequential()
    for name in {[ESC, NUL, RLO]!r}:
        net.add_module(name, nn.Linear(2, 2))
    return net


def example_inputs(batch_size):
    import torch
    return torch.ones(batch_size, 2)
'''


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("names")
    (folder / "names.py").write_text(MODEL_FILE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INSPECTOR_MODEL_DIRS", str(folder))
        yield f"{folder}/names.py:build"


def test_the_terminal_shows_controls_and_overrides_as_escapes(source, capsys, monkeypatch):
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", source.rsplit("/", 1)[0])
    assert main(["offsets", source]) == 0
    out, err = capsys.readouterr()
    assert "\\x1b[31mred" in out and "nul\\x00byte" in out and "evil\\u202etxt-exe" in out
    assert not any(c in out + err for c in RAW)


@pytest.mark.parametrize("fmt", ["to_markdown", "to_html", "to_json"])
def test_reports_show_them_escaped_and_json_keeps_the_exact_names(source, fmt, monkeypatch):
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", source.rsplit("/", 1)[0])
    report = build_report(load_model(source), ["summary", "offsets", "captures"])
    text = getattr(report, fmt)()
    assert not any(c in text for c in RAW), fmt
    assert "202e" in text and "x1b" in text.replace("u001b", "x1b")
    if fmt == "to_json":  # the same data: the escapes are JSON's own
        names = {row[0] for s in json.loads(text)["sections"] for t in s.get("tables", [])
                 for row in t.get("rows", []) if row and isinstance(row[0], str)}
        assert {f"{n}.weight" for n in (ESC, NUL, RLO)} <= names
