"""``python -m inspector watch``, driven in-process through ``main(argv)``."""

from __future__ import annotations

import textwrap

import pytest

from inspector import read_run
from inspector.__main__ import main

PLANTED = textwrap.dedent('''
    import torch
    from torch import nn


    class Net(nn.Module):  # a (4->4) then b (4->1); at the third call a's output is scaled by Inf
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 1)
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            return self.b(self.a(x) * (float("inf") if self.calls == 3 else 1.0))


    def build():
        torch.manual_seed(0)
        return Net()


    def example_inputs(batch_size):
        return torch.ones(batch_size, 4)


    def loss(outputs, inputs):
        return outputs.pow(2).mean()
''')


def test_watch_command_writes_the_run_file_and_exits_0(tmp_path, capsys):
    out = tmp_path / "run.inspect"
    assert main(["watch", "sample:tiny-gpt2", "--steps", "3", "--lr", "0.01", "-o", str(out)]) == 0
    run = read_run(out)
    assert run.complete and run.steps["step"].tolist() == [0, 1, 2]
    assert run.steps["lr_0"].tolist() == [0.01] * 3 and run.steps["loss"].notna().all()
    assert "transformer.h.0.attn.c_attn" in run.module_order
    assert "3 steps watched" in capsys.readouterr().out


def test_findings_print_as_they_appear_and_fail_on_error(tmp_path, monkeypatch, capsys):
    (tmp_path / "planted.py").write_text(PLANTED)
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    args = ["watch", f"{tmp_path / 'planted.py'}:build", "--steps", "4", "--nonfinite", "--optimizer", "sgd",
            "-o", str(tmp_path / "r.inspect")]
    assert main(args) == 0  # the run completed: findings alone do not fail it
    text = capsys.readouterr().out
    assert "step 2 · error · nonfinite-forward at (model)" in text  # the forward itself scaled by Inf
    summary = text.splitlines()[-2:]  # the end summary opens with the first error
    assert summary[0].startswith("First error: step 2 · nonfinite-forward at (model) — ") and \
        summary[1].startswith("4 steps watched; ")
    assert main(args + ["--fail-on", "error"]) == 1


def test_bad_source_exits_2(tmp_path, capsys):
    assert main(["watch", "sample:no-such-model", "--steps", "1", "-o", str(tmp_path / "r.inspect")]) == 2
    assert "no-such-model" in capsys.readouterr().err


def test_report_of_a_run_with_captures_and_of_the_captures_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "planted.py").write_text(PLANTED)
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    run = tmp_path / "r.inspect"
    assert (
        main(["watch", f"{tmp_path / 'planted.py'}:build", "--steps", "3", "--nonfinite", "-o", str(run)])
        == 0
    )
    assert main(["report", str(run), "-o", str(tmp_path / "r.md")]) == 0
    assert "## Captures of (model) at step 2" in (tmp_path / "r.md").read_text().replace("\\", "")
    capsys.readouterr()
    assert main(["report", f"{run}.captures.safetensors", "-o", str(tmp_path / "c.md")]) == 2
    assert f"report {run} -o" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["watch", pytest.param("distributed", marks=pytest.mark.collectives)])
def test_a_model_without_a_loss_exits_2_for_both_training_commands(command, tmp_path, monkeypatch, capsys):
    (tmp_path / "noloss.py").write_text("import torch\n\ndef build():\n    return torch.nn.Linear(2, 1)\n")
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    args = [command, f"{tmp_path / 'noloss.py'}:build", "--steps", "1", "-o", str(tmp_path / "r.out")]
    assert main(args) == 2
    assert "noloss.py:build defines no loss(outputs, inputs)" in capsys.readouterr().err


def test_watch_without_o_writes_a_new_file_and_replaces_none(tmp_path, monkeypatch, capsys):
    """run.inspect taken (here by another command's file) and run-1.inspect a dangling link: the run goes
    to run-2.inspect, the others are left as they were; with -o the named file is replaced."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.inspect").write_bytes(b"another command's run file")
    (tmp_path / "run-1.inspect").symlink_to(tmp_path / "gone")
    assert main(["watch", "sample:tiny-gpt2", "--steps", "2"]) == 0
    assert (tmp_path / "run.inspect").read_bytes() == b"another command's run file"
    assert not (tmp_path / "gone").exists()
    assert read_run(tmp_path / "run-2.inspect").steps["step"].tolist() == [0, 1]
    assert capsys.readouterr().out.rstrip().endswith("run-2.inspect")  # the closing line names it
    assert main(["watch", "sample:tiny-gpt2", "--steps", "1", "-o", "run.inspect"]) == 0
    assert read_run(tmp_path / "run.inspect").steps["step"].tolist() == [0]
