"""``w.replay(step)`` on the watch still open: the same result as ``inspector.replay`` on the run file,
the model left as it was (weights, buffers, gradients, versions, modes, generators), and the run going on
as if no replay had happened."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import inspector
from inspector import InspectorError, read_run, replay, watch
from inspector.replaying import ReplayFile, replay_files


class Normed(nn.Module):
    """fc1 -> batch norm -> dropout -> fc2; a batch whose first value is over 50 takes a log of a negative
    in ``fc2``'s output (NaN)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.bn = nn.Linear(4, 8), nn.BatchNorm1d(8)
        self.drop, self.fc2 = nn.Dropout(0.25), nn.Linear(8, 2)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        y = self.fc2(self.drop(self.bn(self.fc1(x))))
        return torch.log(y - 100.0) if bool(x[0, 0] > 50) else y


def _loss(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return out.pow(2).mean()


def _train(path: Path, steps: int = 12, replay_at: int | None = None, scale_hook: bool = False,
           **options: Any) -> tuple:
    """Train ``steps`` steps under a watch that keeps steps; in step ``replay_at``, between its backward and
    its optimizer step, replay step 3 with ``w.replay``. Returns the model, the watch, the live replay and
    the state around it."""
    torch.manual_seed(0)
    model = Normed()
    if scale_hook:  # the user's own tensor hook: it fires in the replay as in training
        model.fc2.weight.register_hook(lambda g: g * 2.0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data = torch.Generator().manual_seed(1)
    live, around = None, {}
    with watch(model, opt, path, keep=True, **options) as w:
        for i in range(steps):
            x = torch.randn(16, 4, generator=data)
            if i == 3:
                x[0, 0] = 99.0  # step 3: a NaN loss
            loss = _loss(model(x), x)
            loss.backward()
            for p in model.parameters():  # the loop drops NaN gradients: the steps after 3 are healthy again
                p.grad.nan_to_num_(0.0)
            if replay_at is not None and i == replay_at:  # in the middle of a step: its gradients are there
                around["before"] = _state(model)
                live = w.replay(3, loss=_loss)
                around["after"] = _state(model)
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return model, w, live, around


def _state(model: nn.Module) -> dict[str, Any]:
    return {
        "tensors": {k: v.clone() for k, v in model.state_dict(keep_vars=True).items()},
        "versions": {k: v._version for k, v in model.state_dict(keep_vars=True).items()},
        "grads": [(p.grad, None if p.grad is None else p.grad.clone()) for p in model.parameters()],
        "ids": [id(p) for p in model.parameters()],
        "modes": [m.training for m in model.modules()],
        "rng": torch.get_rng_state(),
        "calls": model.calls,
        "hooks": [
            (list(m._forward_hooks), list(m._forward_pre_hooks), list(m._backward_hooks))
            for m in model.modules()
        ],
        "tensor_hooks": [list(p._backward_hooks or {}) for p in model.parameters()],
    }


def _float_bits(x: float) -> bytes:
    return struct.pack("<d", x)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8)


def test_a_live_replay_leaves_the_model_as_it_was(tmp_path: Path) -> None:
    _, _, live, around = _train(tmp_path / "run.inspect", replay_at=10)
    before, after = around["before"], around["after"]
    assert live is not None and live.reproduced is True
    for k, t in before["tensors"].items():  # every bit, NaN included: weights and BatchNorm's statistics
        assert torch.equal(_bits(t), _bits(after["tensors"][k])), k
    assert before["versions"] == after["versions"]  # the watch reads them: a write outside the optimizer
    assert before["ids"] == after["ids"] and before["modes"] == after["modes"]
    assert before["calls"] == after["calls"]
    for (g0, c0), (g1, _) in zip(before["grads"], after["grads"], strict=True):
        assert g1 is g0 and (g0 is None or torch.equal(_bits(c0), _bits(g1)))  # the same objects, unchanged
    assert torch.equal(before["rng"], after["rng"])
    assert before["hooks"] == after["hooks"] and before["tensor_hooks"] == after["tensor_hooks"]  # in order


def test_a_live_replay_equals_the_replay_of_the_run_file(tmp_path: Path) -> None:
    path = tmp_path / "run.inspect"
    model, _, live, _ = _train(path, replay_at=10, scale_hook=True)
    assert live is not None
    later = replay(path, 3, model=model, loss=_loss)
    assert live.file == later.file and live.step == later.step == 3
    assert live.reproduced is later.reproduced is True
    assert [_float_bits(x) for x in live.losses] == [_float_bits(x) for x in later.losses]  # NaN's bits too
    assert [(o.op, o.phase, o.module, o.source) for o in live.ops] == [
        (o.op, o.phase, o.module, o.source) for o in later.ops
    ]
    assert live.first is not None and (live.first.op, live.first.module) == ("aten.log.default", "(model)")
    assert live.captures.order == later.captures.order
    for name, out in live.captures.outputs.items():
        assert torch.equal(_bits(out), _bits(later.captures.outputs[name])), name
    assert live.gradients[["name", "state"]].equals(later.gradients[["name", "state"]])
    a, b = live.gradients["norm"].to_numpy(), later.gradients["norm"].to_numpy()
    assert ((a == b) | ((a != a) & (b != b))).all()  # NaN where the other has NaN
    assert [f.to_dict() for f in live.findings] == [f.to_dict() for f in later.findings]


@pytest.mark.parametrize("options", [{}, {"nonfinite": True, "update_ratio": True}])
def test_the_run_goes_on_as_if_no_replay_had_happened(tmp_path: Path, options: dict[str, Any]) -> None:
    plain_model, plain, _, _ = _train(tmp_path / "plain.inspect", **options)
    model, w, live, _ = _train(tmp_path / "replayed.inspect", replay_at=10, **options)
    assert live is not None and live.ops  # it ran, and found the op
    a, b = read_run(tmp_path / "plain.inspect"), read_run(tmp_path / "replayed.inspect")
    cols = ["step", "loss", "grad_norm"]
    assert a.steps[cols].equals(b.steps[cols])
    assert a.modules.drop(columns=[c for c in a.modules.columns if "time" in c]).equals(
        b.modules.drop(columns=[c for c in b.modules.columns if "time" in c]))
    assert [(f.step, f.code, f.where) for f in plain.result.findings] == [
        (f.step, f.code, f.where) for f in w.result.findings
    ]
    for (n, p), q in zip(plain_model.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(_bits(p), _bits(q)), n
    # the replay's forward was not kept as a call of the step it ran in (the keeper's hook was quiet)
    files = [ReplayFile(f) for f in replay_files(tmp_path / "replayed.inspect")]
    plain_files = [ReplayFile(f) for f in replay_files(tmp_path / "plain.inspect")]
    assert [[len(s.calls) for s in f.meta.steps] for f in files] == [
        [len(s.calls) for s in f.meta.steps] for f in plain_files
    ]


def test_a_live_replay_after_the_block_and_of_a_step_not_kept(tmp_path: Path) -> None:
    path = tmp_path / "run.inspect"
    model, w, _, _ = _train(path)
    r = w.replay(3, loss=_loss)  # after the block: the same call
    assert r.reproduced is True and r.first is not None
    again = inspector.replay(path, 3, model=model, loss=_loss)
    assert json.dumps(r.to_dict(), sort_keys=True) == json.dumps(again.to_dict(), sort_keys=True)  # NaN too
    kept = r"step 1 of run\.inspect was not kept.*hold steps 2 \(no weights\), 3"
    with pytest.raises(InspectorError, match=kept):
        w.replay(1)
