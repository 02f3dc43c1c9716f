"""The mutation watch on chains that hand one tensor on: every capture of it is still told
apart (which were overwritten, by whom), and the work grows linearly with the chain.

(The seconds for 2k-16k modules are in ``benchmarks/bench_capture_chain.py``.)
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import inspector.capture.watch as watch
from inspector import capture_activations

MODES = {"no_grad": torch.no_grad, "inference": torch.inference_mode}


def _capture(net: nn.Module, x: torch.Tensor, mode: str):
    with MODES[mode]():
        return capture_activations(net, x)


@pytest.mark.parametrize("mode", list(MODES))
def test_captures_of_one_tensor_before_an_inplace_write_are_all_mutated(mode):
    # 0 and 1 pass x = -1 on; 2 writes it in place to 0; 3 passes it on: 0 and 1 are overwritten by 2
    net = nn.Sequential(nn.Identity(), nn.Identity(), nn.ReLU(inplace=True), nn.Identity())
    cap = _capture(net, -torch.ones(2, 3), mode)
    assert cap.mutated == {"0": "2", "1": "2"}
    assert [(m.module, m.max_abs_change) for m in cap.mutations] == [("0", 1.0), ("1", 1.0)]
    assert torch.equal(cap.outputs["1"], -torch.ones(2, 3)) and torch.equal(
        cap.outputs["3"], torch.zeros(2, 3)
    )


def test_writes_that_keep_the_values_name_each_capture_first_writer():
    # x = 1 stays 1 through each ReLU: 0 is written by 1 first; 1 and 2 (the same values) by 3
    net = nn.Sequential(nn.Identity(), nn.ReLU(inplace=True), nn.Identity(), nn.ReLU(inplace=True))
    cap = _capture(net, torch.ones(2, 3), "no_grad")
    same = {f.where: f.message for f in cap.findings if f.code == "capture-written-same-values"}
    assert cap.mutated == {}
    assert {k: v.split(" by ")[1].split()[0] for k, v in same.items()} == {"0": "1", "1": "3", "2": "3"}


def test_a_write_inside_the_model_forward_marks_every_capture_of_the_tensor():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Identity(), nn.Identity()

        def forward(self, x):
            y = self.b(self.a(x * 1))
            return y.mul_(3)  # in no submodule: the model's own forward is named
    cap = _capture(Net(), torch.ones(2), "no_grad")
    assert cap.mutated == {"a": "(model)", "b": "(model)"}


@pytest.mark.parametrize("mode", list(MODES))
def test_comparisons_grow_linearly_with_a_chain_of_inplace_modules(mode, monkeypatch):
    calls = []
    real = watch.max_abs_change
    monkeypatch.setattr(watch, "max_abs_change", lambda *a: calls.append(1) or real(*a))
    counts = {}
    for n in (50, 200):
        calls.clear()
        cap = _capture(nn.Sequential(*[nn.ReLU(inplace=True) for _ in range(n)]), torch.ones(1, 4), mode)
        assert len(cap.outputs) == n and not cap.mutated
        counts[n] = len(calls)
    # one comparison per module (and, with version counters, one more per capture at the end); a
    # watch that compared every earlier capture made n^2/2: 1,225 and 19,900
    assert counts[200] <= 2 * 200 + 2 and counts[200] <= 4.2 * counts[50], counts
