"""``w.clip_grad_norm_``: torch's clip from the norms the watch takes anyway, one pass over the gradients."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from inspector import watch
from inspector.watching import read_run


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))


def _batch(i: int) -> torch.Tensor:
    return torch.randn(8, 6, generator=torch.Generator().manual_seed(i)) * 5


def _train(clip, tmp_path=None, steps: int = 5, max_norm: float = 0.5):
    """Train a fresh model, clipping with ``clip(model, w)`` (``w`` None without a watch); returns the
    model, the totals the clip returned, and how many ``torch._foreach_norm`` calls the run made."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    totals, calls = [], [0]
    real = torch._foreach_norm

    def counted(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    block = watch(model, opt, tmp_path / "run.inspect") if tmp_path is not None else None
    w = block.__enter__() if block is not None else None
    torch._foreach_norm = counted
    try:
        for i in range(steps):
            model(_batch(i)).pow(2).mean().backward()
            totals.append(float(clip(model, w, max_norm)))
            opt.step()
            opt.zero_grad()
    finally:
        torch._foreach_norm = real
        if block is not None:
            block.__exit__(None, None, None)
    return model, totals, calls[0]


def _torch_clip(model, w, max_norm):
    return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)


def _watch_clip(model, w, max_norm):
    return w.clip_grad_norm_(max_norm)


def test_the_watch_clips_as_torch_does_from_its_own_pass(tmp_path):
    plain, plain_totals, _ = _train(_torch_clip)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    watched, totals, one_pass = _train(_watch_clip, tmp_path / "a")
    _, _, two_passes = _train(_torch_clip, tmp_path / "b")
    assert totals == pytest.approx(plain_totals, rel=1e-6) and max(totals) > 0.5  # the clip acted
    for a, b in zip(plain.parameters(), watched.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)  # the same training
    assert one_pass < two_passes  # torch's clip inside the watch reads the gradients a second time
    steps = read_run(tmp_path / "a" / "run.inspect").steps
    assert steps["grad_norm"].tolist() == pytest.approx(totals, rel=1e-6)  # the pre-clip norm is recorded


def test_another_norm_type_is_torchs_own_clip(tmp_path):
    model = _model()
    model(_batch(0)).pow(2).mean().backward()
    expected = max(p.grad.abs().max() for p in model.parameters())
    with watch(model, None, tmp_path / "run.inspect") as w:
        total = w.clip_grad_norm_(0.01, norm_type=math.inf)
        w.step()
    assert float(total) == pytest.approx(float(expected))
    assert max(float(p.grad.abs().max()) for p in model.parameters()) <= 0.01 + 1e-6


def test_a_non_finite_total_is_refused_when_asked(tmp_path):
    model = _model()
    model(_batch(0)).pow(2).mean().backward()
    model[0].weight.grad[0, 0] = math.nan
    with watch(model, None, tmp_path / "run.inspect") as w:
        with pytest.raises(RuntimeError, match="non-finite"):
            w.clip_grad_norm_(1.0, error_if_nonfinite=True)
        w.step()


def test_a_loop_with_w_step_records_the_pre_clip_norm_once(tmp_path):
    model = _model()
    expected = []
    with watch(model, None, tmp_path / "run.inspect") as w:
        for i in range(3):
            model(_batch(i)).pow(2).mean().backward()
            expected.append(float(w.clip_grad_norm_(0.5)))
            w.step()  # the step's numbers were taken by the clip: not again, after it
            model.zero_grad()
    steps = read_run(tmp_path / "run.inspect").steps
    assert max(expected) > 0.5  # the clip acted: a second reading would say 0.5
    assert steps["grad_norm"].tolist() == pytest.approx(expected, rel=1e-6)


def test_a_replay_between_a_ddp_forward_and_its_step_is_refused(tmp_path, world1):
    from inspector import InspectorError

    model = nn.parallel.DistributedDataParallel(_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, tmp_path / "run.inspect", keep=True) as w:
        model(_batch(0)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        loss = model(_batch(1)).pow(2).mean()
        said = r"w.replay\(0\) between a training forward pass and its step under DDP"
        with pytest.raises(InspectorError, match=said):
            w.replay(0)
        loss.backward()
        opt.step()
        opt.zero_grad()
