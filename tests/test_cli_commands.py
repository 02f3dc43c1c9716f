"""The command line imports only the chosen command's module; ``--help`` still lists every command."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

from inspector.__main__ import command_names, main

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import json, sys
from inspector.__main__ import main
def loaded():
    return sorted(m for m in sys.modules if m.startswith("inspector.commands."))
rc = main(["--help"])
top = loaded()
rc2 = main(["checkpoint", "--help"])
print(json.dumps({"rc": [rc, rc2], "top": top, "checkpoint": loaded()}))
"""


def test_help_lists_every_command_with_its_one_line_description(capsys):
    assert main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the lines
    names = command_names()
    assert names == ["aliases", "attribute", "capture", "checkpoint", "devicemap", "distributed", "offsets",
                     "report", "summary"]
    for name in names:
        help_text = importlib.import_module(f"inspector.commands.{name}").HELP
        assert f"{name} {' '.join(help_text.split())}" in text, name


def test_only_the_chosen_command_module_is_imported():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=True).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["rc"] == [0, 0]
    assert seen["top"] == []  # the list of commands comes from their source files
    assert seen["checkpoint"] == ["inspector.commands._common", "inspector.commands._types",
                                  "inspector.commands.checkpoint"]


def test_options_before_the_command_and_unknown_commands(capsys, tmp_path):
    assert main(["--debug", "checkpoint", str(tmp_path / "none.safetensors")]) == 2
    assert "none.safetensors" in capsys.readouterr().err
    assert main(["nosuch"]) == 2
    assert "invalid choice: 'nosuch'" in capsys.readouterr().err
