"""``python -m inspector replay``, driven in-process through ``main(argv)``: a run trained by ``watch --keep``
from a model file, replayed on the model built again from the source the run file records."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from inspector.__main__ import main

PLANTED = textwrap.dedent("""
    import torch
    from torch import nn

    BATCHES = [0]


    class Log(nn.Module):
        def forward(self, x):
            return torch.log(x + 0.5)  # x = -1 in the third batch: log(-0.5)


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.log, self.b = nn.Linear(4, 4), Log(), nn.Linear(4, 1)

        def forward(self, x):
            return self.b(self.a(self.log(x)))


    def build():
        torch.manual_seed(0)
        return Net()


    def example_inputs(batch_size):
        BATCHES[0] += 1
        return torch.full((batch_size, 4), -1.0 if BATCHES[0] == 3 else 1.0)


    def loss(outputs, inputs):
        return outputs.pow(2).mean()
""")


def _trained(tmp_path: Path, monkeypatch) -> Path:
    (tmp_path / "planted.py").write_text(PLANTED)
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    run = tmp_path / "r.inspect"
    assert (
        main(
            [
                "watch",
                f"{tmp_path / 'planted.py'}:build",
                "--steps",
                "4",
                "--keep",
                "--optimizer",
                "sgd",
                "-o",
                str(run),
            ]
        )
        == 0
    )
    return run


def test_replay_names_the_op_and_line_from_the_recorded_source(tmp_path, monkeypatch, capsys):
    run = _trained(tmp_path, monkeypatch)
    assert (tmp_path / "r.inspect.step2.replay.safetensors").exists()
    capsys.readouterr()
    out = tmp_path / "replay.json"
    assert main(["replay", str(run), "--step", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    line = f"{tmp_path / 'planted.py'}:10"
    assert text.splitlines()[0].startswith(
        "step 2: reproduced (loss nan, recorded nan); first NaN/Inf: forward "
        f"aten.log.default in log at {line}"
    )
    assert "return torch.log(x + 0.5)" in text
    data = json.loads(out.read_text())
    assert data["reproduced"] is True and data["ops"][0]["op"] == "aten.log.default"
    assert data["ops"][0]["inputs"][0]["low"] == -0.5 == data["ops"][0]["inputs"][0]["high"]


def test_a_step_not_kept_and_a_model_that_does_not_build_exit_2(tmp_path, monkeypatch, capsys):
    run = _trained(tmp_path, monkeypatch)
    capsys.readouterr()
    assert main(["replay", str(run), "--step", "0"]) == 2
    assert "step 0 of r.inspect was not kept with its weights" in capsys.readouterr().err
    assert main(["replay", str(run), "--step", "2", "--model", "sample:no-such-model"]) == 2
    assert "the model 'sample:no-such-model' did not build" in capsys.readouterr().err


def test_the_report_gets_a_replayed_step_section(tmp_path, monkeypatch, capsys):
    run = _trained(tmp_path, monkeypatch)
    md, js = tmp_path / "r.md", tmp_path / "r.json"
    assert main(["replay", str(run), "--step", "2", "--report", str(md)]) == 0
    assert main(["replay", str(run), "--step", "2", "--report", str(js)]) == 0
    text = md.read_text().replace("\\", "")
    assert "## Step 2, replayed" in text and "aten.log.default" in text and "planted.py:10" in text
    section = next(s for s in json.loads(js.read_text())["sections"] if s["id"] == "replayed")
    ops = next(t for t in section["tables"] if t["title"].startswith("Ops that made NaN/Inf"))
    assert ops["rows"][0][:3] == ["forward", "aten.log.default", "log"]
    assert section["facts"]["reproduced"] == "yes"
    assert main(["replay", str(run), "--step", "2", "--report", str(tmp_path / "r.txt")]) == 2
