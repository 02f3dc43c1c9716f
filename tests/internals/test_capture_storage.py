"""Copies of CUDA captures to the host overlap the computation and stay exact."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inspector import capture_activations

GRAD_MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference_mode": torch.inference_mode}


@pytest.mark.cuda
@pytest.mark.parametrize("in_flight", [1, 1 << 30])
def test_cuda_copies_to_the_host_overlap_yet_stay_exact(monkeypatch, in_flight):
    from inspector.capture import storage

    # in_flight=1: the compute stream waits for each earlier copy; 1 GiB: copies run freely
    monkeypatch.setattr(storage, "IN_FLIGHT_BYTES", in_flight)
    torch.manual_seed(0)
    # each conv output is 32 x 8 x 128 x 128 float32 = 16 MiB: copies take long enough to race
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=True),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=True)).cuda().eval()
    x = torch.randn(32, 3, 128, 128, device="cuda")
    with torch.no_grad():
        c0 = model[0](x)
        r1 = torch.relu(c0)
        c2 = model[2](r1)
        expected = {"0": c0.cpu(), "1": r1.cpu(), "2": c2.cpu(), "3": torch.relu(c2).cpu()}
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    for mode in GRAD_MODES.values():
        with mode():
            cap = capture_activations(model, x)
        assert cap.mutated == {"0": "1", "2": "3"}  # ReLU(inplace=True) overwrote both convs
        for name, value in expected.items():
            assert cap.outputs[name].is_pinned() and torch.equal(cap.outputs[name], value), name
        del cap
    torch.empty(1, device="cuda")  # lets the allocator take back clones whose copies are done
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() <= before + 512  # no clone outlives the capture
