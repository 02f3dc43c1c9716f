"""The command line imports only the chosen command's module; ``--help`` still lists every command."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from unittest.mock import patch

from inspector.__main__ import main

COMMANDS = Path(__file__).resolve().parents[1] / "inspector" / "commands"


def _help_of(path: Path) -> str | None:
    """The ``HELP = "..."`` text of a command's source file (None for a shared module), read without
    importing it."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and "HELP" in [getattr(t, "id", "") for t in node.targets]:
            return str(ast.literal_eval(node.value))
    return None


def test_help_lists_every_command_with_its_one_line_description(capsys):
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    helps = {p.stem: _help_of(p) for p in sorted(COMMANDS.glob("*.py"))}
    names = sorted(n for n, h in helps.items() if h is not None)
    assert names == [
        "aliases",
        "attribute",
        "capture",
        "checkpoint",
        "compare",
        "devicemap",
        "distributed",
        "labs",
        "offsets",
        "replay",
        "report",
        "serve",
        "summary",
        "watch",
    ]
    for name in names:
        assert f"{name} {' '.join(str(helps[name]).split())}" in text, name


def test_only_the_chosen_command_module_is_imported(capsys):
    def loaded() -> list[str]:
        shared = ("inspector.commands.common", "inspector.commands.argtypes")  # what every command uses
        return sorted(m for m in sys.modules if m.startswith("inspector.commands.") and m not in shared)

    with patch.dict(sys.modules):  # the command modules this process has, restored afterwards
        for name in loaded():
            del sys.modules[name]
        assert main(["--help"]) == 0
        assert loaded() == []  # the list of commands comes from their source files
        assert main(["checkpoint", "--help"]) == 0
        assert loaded() == ["inspector.commands.checkpoint"]
    assert "usage: python -m inspector checkpoint" in capsys.readouterr().out


def test_options_before_the_command_and_unknown_commands(capsys, tmp_path):
    assert main(["--debug", "checkpoint", str(tmp_path / "none.safetensors")]) == 2
    assert "none.safetensors" in capsys.readouterr().err
    assert main(["nosuch"]) == 2
    assert "invalid choice: 'nosuch'" in capsys.readouterr().err


def test_messages_name_the_command_as_it_was_run(monkeypatch, tmp_path):
    import pytest
    import torch
    from torch import nn

    from inspector import InspectorError, Report, gradient_report

    monkeypatch.setattr(sys, "argv", ["/somewhere/bin/model-inspector"])
    for text in ("not json", "[1]", '{"schema_version": "1.0"}'):
        with pytest.raises(InspectorError, match=r"written by 'model-inspector report --format json'"):
            Report.from_json(text)
    model = nn.Linear(2, 1)
    model(torch.ones(1, 2))  # no backward yet
    [finding] = gradient_report(model).findings
    assert "`model-inspector offsets SOURCE --backward`" in finding.message
    monkeypatch.setattr(sys, "argv", ["/somewhere/inspector/__main__.py"])
    assert "`python -m inspector offsets SOURCE --backward`" in gradient_report(model).findings[0].message
