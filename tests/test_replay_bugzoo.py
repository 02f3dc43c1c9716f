"""The bug zoo's NaN/Inf and exploding cases, trained with keep=True and replayed on the live model: the loss
comes back bit for bit and the first NaN/Inf is named (the op with its module and line, the batch or the
weights). The whole table is ``python -m benchmarks.bugzoo.replays`` (docs/replay.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from benchmarks.bugzoo.replays import replay_case
from benchmarks.bugzoo.runner import select

ROOT = Path(__file__).resolve().parents[1]


def _line(path: str, text: str) -> str:
    """``path:line`` of the line of the zoo's ``path`` that holds ``text`` (the planted op)."""
    lines = (ROOT / path).read_text().splitlines()
    return f"{path}:{next(i for i, t in enumerate(lines, 1) if text in t)}"


@pytest.mark.parametrize(
    ("name", "culprit", "module", "line"),
    [
        (
            "mlp-backward-nan",
            "backward aten.mul.Tensor",
            "gate",
            _line("benchmarks/bugzoo/models.py", 'grad * float("nan")'),
        ),
        (
            "cnn-div-zero-conv2",
            "forward aten.div.Tensor",
            "conv2",
            _line("benchmarks/bugzoo/cases_plain.py", "/ 0.0"),
        ),
        (
            "gpt2-div-zero-mlp",
            "forward aten.div.Tensor",
            "transformer.h.1.mlp.c_fc",
            _line("benchmarks/bugzoo/cases_plain.py", "/ 0.0"),
        ),
        (  # the loop's own loss at the planted step: p * log(p) with p = 0, outside the model
            "mlp-loss-log0",
            "forward aten.log.default",
            "(loss)",
            _line("benchmarks/bugzoo/cases_plain.py", "torch.log(p)"),
        ),
        ("mlp-nan-batch", "(batch)", "args[0]", ""),
        ("llama-inf-weight", "(weights)", "model.layers.1.mlp.down_proj.weight", ""),
        ("lstm-exploding-head", "", "", ""),
    ],
)
def test_a_zoo_case_replays_bit_equal_and_names_its_culprit(
    name: str, culprit: str, module: str, line: str
) -> None:
    torch.set_num_threads(1)
    (case,) = [c for c in select(name) if c.name == name]
    row = replay_case(case, steps=32)
    assert row.step == 30 == row.planted  # the planted step was kept and replayed
    assert row.reproduced is True
    assert (row.culprit, row.module, row.source) == (culprit, module, line)
