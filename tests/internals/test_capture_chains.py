"""The mutation watch on chains that hand one tensor on: every capture of it is still told
apart (which were overwritten, by whom), and the work grows linearly with the chain; the two
comparisons behind it (``same_bytes``, ``max_abs_change``) worked out by hand.

(The seconds for 2k-16k modules are in ``benchmarks/bench_capture_chain.py``.)
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import inspector.capture.watch as watch
from inspector import capture_activations
from inspector.capture.compare import max_abs_change, same_bytes

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


# -- same_bytes and max_abs_change: the comparisons behind the watch, worked out by hand -------------
def test_same_bytes_compares_the_bytes_of_contiguous_cpu_tensors():
    two = torch.tensor([1.0, math.nan])  # 8 bytes: read as one int64; a NaN's bytes equal themselves
    assert same_bytes(two, two.clone()) is True
    assert same_bytes(two, torch.tensor([1.0, 2.0])) is False
    assert same_bytes(torch.tensor([0.0]), torch.tensor([-0.0])) is False  # equal values, other bytes
    one = torch.tensor([1.5])  # 4 bytes; 9 bytes: not a multiple of 8, read byte by byte
    nine = torch.arange(9, dtype=torch.uint8)
    assert same_bytes(one, one.clone()) is True and same_bytes(nine, nine.clone()) is True
    assert same_bytes(nine, nine.flip(0).contiguous()) is False
    assert same_bytes(torch.tensor([7], dtype=torch.uint8), torch.tensor([7], dtype=torch.uint8)) is True


def test_same_bytes_leaves_to_torch_what_it_cannot_read_as_bytes():
    t = torch.arange(6.0).reshape(2, 3)
    assert same_bytes(t.t(), t.t().contiguous()) is None  # not contiguous, either side
    assert same_bytes(t.t().contiguous(), t.t()) is None
    assert same_bytes(torch.empty(0), torch.empty(0)) is None
    z = torch.tensor([1 + 1j])
    assert same_bytes(z.conj(), z.conj()) is None
    assert same_bytes(torch.ones(2, device="meta"), torch.ones(2, device="meta")) is None


def test_max_abs_change_worked_out_by_hand():
    assert max_abs_change(torch.zeros(2), torch.zeros(3)) == math.inf  # another shape
    assert max_abs_change(torch.zeros(2, dtype=torch.float64), torch.zeros(2)) == math.inf  # another dtype
    big = torch.zeros(65536)  # 256 KiB: compared by its bytes, not torch.equal first
    assert max_abs_change(big, big.clone()) == 0.0
    moved = big.clone()
    moved[5] = -2.5
    assert max_abs_change(moved, big) == 2.5
    nan = math.nan
    assert max_abs_change(torch.tensor([nan, 1.0]), torch.tensor([nan, 1.5])) == 0.5  # a NaN kept: no change
    assert max_abs_change(torch.tensor([0.0, 1.0]), torch.tensor([nan, 1.0])) == math.inf  # a NaN made 0
    assert max_abs_change(torch.tensor([5, 1]), torch.tensor([-2, 1])) == 7.0  # integers
    assert max_abs_change(torch.tensor([3 + 4j]), torch.tensor([0j])) == 5.0  # complex: |3 + 4i|
    assert max_abs_change(torch.tensor([-0.0]), torch.tensor([0.0])) == 0.0
    live = torch.arange(6.0).reshape(2, 3).t()  # not contiguous: compared by torch
    copy = live.contiguous()
    assert max_abs_change(live, copy) == 0.0
    copy[0, 0] = 4.0
    assert max_abs_change(live, copy) == 4.0
