"""Gradient norms from one pass: explicit gradients, fresh numbers on every call, the reduce seam."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from inspector import InspectorError, gradient_norms
from inspector.offsets import gradient_l2_norms, gradient_report


class CountNorms(TorchDispatchMode):
    """Counts the fused norm kernels that run (each one reads its gradients once)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket is torch.ops.aten._foreach_norm:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def two_layers() -> nn.Sequential:
    model = nn.Sequential(nn.Linear(2, 1, bias=False), nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[1.0, 2.0]]))
        model[1].weight.fill_(3.0)
    return model


def test_explicit_gradients_from_autograd_grad_leave_grad_alone():
    model = two_layers()
    x = torch.tensor([[1.0, 1.0]])
    loss = model(x).sum()  # 3 * (w0 . x): d/dw0 = [3, 3] (norm 3*sqrt(2)); d/dw1 = w0 . x = 3
    names = [n for n, _ in model.named_parameters()]
    grads = dict(zip(names, torch.autograd.grad(loss, list(model.parameters())), strict=True))
    table = gradient_norms(model, grads=grads).set_index("name")
    assert table.loc["0.weight", "norm"] == pytest.approx(3 * math.sqrt(2))
    assert table.loc["1.weight", "norm"] == 3.0
    assert set(table["state"]) == {"ok"}
    modules = gradient_norms(model, by="module", grads=grads).set_index("name")
    assert modules.loc["(model)", "norm"] == pytest.approx(math.sqrt(18 + 9))  # sqrt(27)
    assert all(p.grad is None for p in model.parameters())
    # and .grad itself is still "no gradient"
    assert set(gradient_norms(model)["state"]) == {"none"}


def test_explicit_gradients_match_the_grad_attribute_on_a_real_backward(tiny_gpt2):
    x = torch.randint(0, 32, (2, 8))
    out = tiny_gpt2(x)
    logits = out.logits if hasattr(out, "logits") else out[0] if isinstance(out, tuple) else out
    loss = logits.float().pow(2).mean()
    named = list(tiny_gpt2.named_parameters())
    grads = dict(
        zip(
            [n for n, _ in named],
            torch.autograd.grad(loss, [p for _, p in named], retain_graph=True),
            strict=True,
        )
    )
    loss.backward()
    explicit = gradient_report(tiny_gpt2, grads=grads)
    attribute = gradient_report(tiny_gpt2)
    assert explicit.by_parameter.equals(attribute.by_parameter)
    assert explicit.by_module.equals(attribute.by_module)
    assert explicit.total_norm == attribute.total_norm


def test_explicit_gradients_name_checks(tiny_gpt2):
    g = torch.ones(32, 16)
    # a tied parameter can be given under its second name; it still counts once
    modules = gradient_norms(tiny_gpt2, by="module", grads={"lm_head.weight": g}).set_index("name")
    assert modules.loc["transformer.wte", "norm"] == modules.loc["(model)", "norm"]  # once, not twice
    assert modules.loc["lm_head", "norm"] == pytest.approx(math.sqrt(32 * 16), rel=1e-6)
    with pytest.raises(InspectorError, match="'transformer.wte.weigth'.*close names: transformer.wte.weight"):
        gradient_norms(tiny_gpt2, grads={"transformer.wte.weigth": g})
    with pytest.raises(InspectorError, match=r"lm_head.weight has shape \(2,\).*\(32, 16\)"):
        gradient_report(tiny_gpt2, grads={"lm_head.weight": torch.ones(2)})
    with pytest.raises(InspectorError, match="one tied parameter"):
        gradient_report(tiny_gpt2, grads={"lm_head.weight": g, "transformer.wte.weight": g.clone()})
    with pytest.raises(InspectorError, match="list, not a tensor"):
        gradient_report(tiny_gpt2, grads={"lm_head.weight": [1.0]})


def test_gradient_report_gives_both_tables_from_one_pass():
    model = two_layers()
    model[0].weight.grad = torch.tensor([[3.0, 4.0]])
    model[1].weight.grad = torch.tensor([[12.0]])
    with CountNorms() as counter:
        report = gradient_report(model)
    assert counter.calls == 1
    assert report.by_parameter["norm"].tolist() == [5.0, 12.0]
    assert report.by_module.set_index("name").loc["(model)", "norm"] == 13.0


def test_every_call_sees_the_gradients_as_they_are_now():
    model = two_layers()
    model[0].weight.grad = torch.tensor([[3.0, 4.0]])
    model[1].weight.grad = torch.tensor([[12.0]])
    assert gradient_norms(model)["norm"].tolist() == [5.0, 12.0]
    # hand-written clipping through .data: the version counter does not move
    version = model[0].weight.grad._version
    model[0].weight.grad.data.mul_(2)
    assert model[0].weight.grad._version == version
    assert gradient_norms(model)["norm"].tolist() == [10.0, 12.0]
    assert gradient_norms(model, by="module").set_index("name").loc["0", "norm"] == 10.0
    assert gradient_report(model).total_norm == pytest.approx(math.hypot(10.0, 12.0))
    model[1].weight.grad.mul_(7)
    assert gradient_norms(model)["norm"].tolist() == [10.0, 84.0]
    model[1].weight.grad = torch.tensor([[0.0]])
    assert gradient_norms(model)["norm"].tolist() == [10.0, 0.0]
    model[1].weight.requires_grad_(False)
    assert gradient_norms(model)["state"].tolist() == ["ok", "frozen"]
    assert gradient_norms(model, grads={"0.weight": torch.tensor([[6.0, 8.0]])})["norm"].tolist()[0] == 10.0
    assert gradient_norms(model)["norm"].tolist()[0] == 10.0


def test_one_fused_norm_per_dtype_and_the_reduce_seam():
    grads = [torch.tensor([3.0, 4.0]), torch.tensor([1.0], dtype=torch.float64), torch.tensor([12.0]),
             torch.tensor([math.nan])]
    with CountNorms() as counter:
        norms = gradient_l2_norms(grads)
    assert counter.calls == 2  # float32 and float64
    assert norms[:3].tolist() == [5.0, 1.0, 12.0] and math.isnan(norms[3])
    seen = []

    def two_equal_shards(squares: torch.Tensor, indices) -> torch.Tensor:
        seen.append(list(indices))
        return squares * 2  # the other process holds the same numbers

    halves = gradient_l2_norms(grads[:3], reduce=two_equal_shards)
    np.testing.assert_allclose(halves, np.array([5.0, 1.0, 12.0]) * math.sqrt(2), rtol=1e-6)
    assert sorted(seen) == [[0, 2], [1]]
    assert gradient_l2_norms([]).tolist() == []
