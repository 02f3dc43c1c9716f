"""Planted bugs the watch must name through the library: a gradient that is zero (not missing), and
the model's own forward as the producer of an Inf. Public API only: watch(), its findings, the run file
and the captures read back."""

from __future__ import annotations

import math

import torch
from torch import nn

from inspector import read_run, watch


def _data(steps: int):
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(steps, 16, 4, generator=g)
    return xs, xs.sum(-1, keepdim=True)


def _found(w):
    return [(f.step, f.code, f.where) for f in w.findings if f.severity in ("error", "warning")]


def _masked_loop(tmp_path, gate_from: int, steps: int = 30, window: int | None = None):
    """fc (4->8) -> relu -> head (8->1), fc's output multiplied by 0 from step ``gate_from`` on: fc's
    gradients are then exact zeros (present, not None), and so is head's weight gradient (its input is
    relu(0) = 0); head's bias keeps a gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs, ys = _data(steps)
    kw = {} if window is None else {"window": window}
    with watch(model, opt, tmp_path / "r.inspect", **kw) as w:
        for s in range(steps):
            h = model[0](xs[s]) * (0.0 if s >= gate_from else 1.0)
            (model[2](model[1](h)) - ys[s]).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    grads = [p.grad for p in model.parameters()]
    return w, grads


def test_a_gradient_of_zeros_after_a_settled_run_is_a_dead_gradient(tmp_path):
    # gradients at steps 0-23, all-zero ones at 24 and 25: named at 25, like a missing one
    w, grads = _masked_loop(tmp_path, gate_from=24)
    assert all(g is None for g in grads)  # zero_grad() cleared them: nothing was left to read
    assert _found(w) == [(25, "dead-gradient", "0.weight"), (25, "dead-gradient", "0.bias"),
                         (25, "dead-gradient", "2.weight")]
    assert "had a gradient at each of the 24 steps before and none, or an all-zero one" \
        in w.findings[0].message
    run = read_run(tmp_path / "r.inspect")
    assert [(f.step, f.code, f.where) for f in run.findings] == _found(w)
    grad = run.parameters.pivot(index="step", columns="parameter", values="grad_norm")
    assert (grad.loc[24:, ["0.weight", "0.bias", "2.weight"]] == 0).all().all()  # zero, not missing
    assert (grad.loc[24:, "2.bias"] > 0).all()


def test_a_gradient_of_zeros_from_the_start_is_named_after_the_window(tmp_path):
    # a layer multiplied by 0 from step 0 (a zero mask, dead ReLUs): zero at every step of a 3-step window
    w, _ = _masked_loop(tmp_path, gate_from=0, steps=4, window=3)
    assert _found(w) == [(2, "dead-gradient", "0.weight"), (2, "dead-gradient", "0.bias"),
                         (2, "dead-gradient", "2.weight")]


def test_the_same_loop_without_the_mask_is_silent(tmp_path):
    w, _ = _masked_loop(tmp_path, gate_from=30)
    assert _found(w) == []


class Scaled(nn.Module):
    """a (4->4) then b (4->1); the model's own forward scales a's output by Inf at the third call: no
    child produced it, the model itself did."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.b(self.a(x) * (math.inf if self.calls == 3 else 1.0))


def _scaled_run(tmp_path, model: nn.Module, xs: torch.Tensor):
    """Four SGD steps of ``model`` (a ``Scaled``, or one inside another module) on ``xs``, watched with
    ``nonfinite=True``. Returns the watch."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, opt, tmp_path / "r.inspect", nonfinite=True) as w:
        for s in range(4):
            loss = model(xs[s]).pow(2).mean()
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return w


def test_the_model_itself_is_named_as_the_producer(tmp_path):
    torch.manual_seed(0)
    xs = torch.ones(4, 2, 4)
    w = _scaled_run(tmp_path, Scaled(), xs)
    # step 2: not a, whose output was finite; not b, which only took the Inf. The step's NaN gradients
    # then reached a's weights through SGD, so at step 3 a makes NaN from finite inputs: a follow-up of
    # step 2, folded into it, never a new producer
    forward = [f for f in w.findings if f.code == "nonfinite-forward"]
    assert [(f.step, f.where) for f in forward] == [(2, "(model)")]
    assert forward[0].message.startswith("(model) produced NaN/Inf from finite inputs")
    cap = w.result.captures
    assert cap.order == ["(model)"]
    assert torch.equal(cap.inputs["(model)"], xs[2]) and torch.isnan(cap.outputs["(model)"]).all()
    run = read_run(tmp_path / "r.inspect")
    assert [(f.step, f.where) for f in run.findings if f.code == "nonfinite-forward"] == [(2, "(model)")]
    assert run.captures.order == ["(model)"] and torch.equal(run.captures.inputs["(model)"], xs[2])


def test_a_parameter_emptied_by_a_data_swap_is_not_called_non_finite(tmp_path):
    # q (3, 5) is never used by the forward; at step 2 its data becomes an empty tensor: it holds no
    # values at all, so none of them can be NaN/Inf
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Holder())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, opt, tmp_path / "r.inspect") as w:
        for step in range(3):
            if step == 2:
                model[1].q.data = torch.empty(0)
            model(torch.ones(2, 4)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
    assert [(f.step, f.code, f.where) for f in w.findings if f.code == "nonfinite-parameter"] == []


class Holder(nn.Module):
    """A parameter ``q`` the forward does not use, passing its input on."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Parameter(torch.ones(3, 5))

    def forward(self, x):
        return x


class EmptiedHolder(nn.Module):
    """``q`` unused by the forward (emptied by a ``.data`` swap in the test); ``w`` scales the input, and
    from ``bad`` on the output is divided by 0."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Parameter(torch.ones(3, 5))
        self.w = nn.Parameter(torch.ones(4))
        self.bad = False

    def forward(self, x):
        y = x * self.w
        return y / 0 if self.bad else y


def test_a_module_with_an_emptied_parameter_is_still_named_as_the_producer(tmp_path):
    # ZeRO-3 and FSDP with use_orig_params empty the parameters other ranks hold: the module's own NaN
    # output at step 4 is still its own, not the weights'
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), EmptiedHolder())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, opt, tmp_path / "r.inspect", nonfinite=True) as w:
        for step in range(6):
            if step == 2:
                model[1].q.data = torch.empty(0)
            model[1].bad = step >= 4
            model(torch.ones(2, 4)).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
    assert [(f.step, f.code, f.where) for f in w.findings if f.severity == "error"][0] == (
        4, "nonfinite-forward", "1")


def test_a_nested_module_whose_weights_went_nan_is_no_new_producer(tmp_path):
    # the same run one level down: Scaled is the model's module "0", its layers "0.a" and "0.b"; step 3's
    # NaN out of 0.a (its weights made NaN by step 2's update) is folded into step 2's producer
    torch.manual_seed(0)
    w = _scaled_run(tmp_path, nn.Sequential(Scaled()), torch.ones(4, 2, 4))
    assert [(f.step, f.where) for f in w.findings if f.code == "nonfinite-forward"] == [(2, "0")]
