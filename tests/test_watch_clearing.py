"""The gradient-clearing hooks stand down for a step once a forward pass ends with no parameter holding
a gradient the last step used as it left it, and keep looking while one does (``GradientClearing``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inspector import watch


def _mlp() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    """A small MLP, its SGD optimizer and one batch."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01), torch.randn(16, 4)


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> None:
    model(x).pow(2).mean().backward()
    opt.step()


def _clear(model: nn.Module, opt: torch.optim.Optimizer, how: str) -> None:
    if how == "data":  # zeroed through .data: the version counter does not move
        for p in model.parameters():
            p.grad.data.zero_()
    else:
        opt.zero_grad(set_to_none=how == "none")


@pytest.mark.parametrize(("how", "looking"), [("none", False), ("zero_", False), ("data", True)])
def test_hooks_stand_down_only_when_every_used_gradient_is_gone_or_written(tmp_path, how, looking):
    model, opt, x = _mlp()
    with watch(model, opt, tmp_path / "r.inspect") as w:
        clearing = w.kit.clearing
        _step(model, opt, x)
        assert clearing.looking  # the step used gradients: the next backward might add onto them
        _clear(model, opt, how)
        model(x)
        # set to None, or zeroed in place (a new version): nothing left to find; zeroed through .data:
        # the same tensor at the same version, still looked at
        assert clearing.looking is looking
        _clear(model, opt, how)
        _step(model, opt, x)
        assert clearing.looking  # a new step: looking again
        model(x)  # not cleared: the old gradients are still there
        assert clearing.looking
    assert [f.code for f in w.findings if f.severity != "info"] == []


def test_a_parameter_dropped_from_the_hooked_list_keeps_the_hooks_looking(tmp_path):
    model, opt, x = _mlp()
    with watch(model, opt, tmp_path / "r.inspect") as w:
        clearing = w.kit.clearing
        _step(model, opt, x)
        old = list(clearing.attached)
        clearing.attach(old[1:])  # the first parameter stays hooked but is no longer in the list
        assert not clearing.only_attached
        opt.zero_grad()
        model(x)
        assert clearing.looking
        clearing.attach(old)
