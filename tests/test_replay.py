"""Replaying a kept step: the planted op and its line are named, the loss comes back bit for bit, the model
is left as it was, and bad input is refused with the file and what differs."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import inspector
from inspector import InspectorError, replay, watch
from inspector.replaying import ReplayFile, replay_files

HERE = Path(__file__).resolve()


def _line(marker: str) -> str:
    """``file:line`` of the line of this file that ends with ``marker``."""
    for i, text in enumerate(HERE.read_text().splitlines(), 1):
        if text.rstrip().endswith(marker) and "_line(" not in text:
            return f"{HERE}:{i}"
    raise AssertionError(marker)


class BackwardNaN(torch.autograd.Function):
    """Identity forward; its backward returns NaN (a broken custom op)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("nan")  # PLANT:custom-backward


class Planted(nn.Module):
    """fc1 -> dropout -> fc2 (4 -> 8 -> 2); from step ``at`` on, ``plant`` breaks one op in ``block``."""

    def __init__(self, plant: str = "", at: int = 3) -> None:
        super().__init__()
        self.fc1, self.drop, self.block = nn.Linear(4, 8), nn.Dropout(0.25), Block(plant)
        self.at, self.calls = at, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.block.on = self.calls >= self.at
        self.calls += 1
        return self.block(self.drop(torch.relu(self.fc1(x))))


class Block(nn.Module):
    def __init__(self, plant: str) -> None:
        super().__init__()
        self.fc2, self.plant, self.on = nn.Linear(8, 2), plant, False

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        y = self.fc2(h)
        if not self.on:
            return y
        if self.plant == "log":
            return torch.log(y - 100.0)  # PLANT:log
        if self.plant == "div":
            return y / (h.sum(-1, keepdim=True) * 0.0)  # PLANT:div
        if self.plant == "fp16":
            big = (y.abs() + 300.0).half()
            return (big @ big.t()).float()[:, :2]  # PLANT:fp16
        if self.plant == "backward":
            return BackwardNaN.apply(y)
        return y


def _loss(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return out.pow(2).mean()


def _train_logged(tmp_path: Path, plant: str, steps: int = 5, **options: Any) -> tuple[Planted, Path]:
    torch.manual_seed(0)
    model = Planted(plant)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    path = tmp_path / "run.inspect"
    data = torch.Generator().manual_seed(1)
    with watch(model, opt, path, keep=True, **options) as w:
        for _ in range(steps):
            x = torch.randn(16, 4, generator=data)
            loss = _loss(model(x), x)
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return model, path


@pytest.mark.parametrize(
    ("plant", "op", "phase", "marker"),
    [
        ("log", "aten.log.default", "forward", "# PLANT:log"),
        ("div", "aten.div.Tensor", "forward", "# PLANT:div"),
        ("fp16", "aten.mm.default", "forward", "# PLANT:fp16"),
        ("backward", "aten.mul.Tensor", "backward", "# PLANT:custom-backward"),
    ],
)
def test_a_planted_op_is_named_with_its_module_and_line(
    tmp_path: Path, plant: str, op: str, phase: str, marker: str
) -> None:
    model, path = _train_logged(tmp_path, plant)
    files = replay_files(path)
    assert [f.name for f in files] == ["run.inspect.step3.replay.safetensors"]  # one file: the first bad step
    r = replay(path, 3, model=model, loss=_loss)
    first = r.first_in(phase)
    assert first is not None and first.op == op
    assert first.module == "block"  # a backward op: the module whose forward made its node
    assert first.source == _line(marker)
    assert first.code.endswith(marker)
    if phase == "backward":
        assert r.first_in("forward") is None  # the forward was finite: the loss too
        assert r.loss is not None and r.loss == r.loss
    assert all(i.low == i.low and i.high == i.high for i in first.inputs)  # the inputs were finite
    assert r.reproduced is True
    assert not r.batch_nonfinite


def test_the_fp16_overflow_names_the_input_range_that_overflowed(tmp_path: Path) -> None:
    model, path = _train_logged(tmp_path, "fp16")
    first = replay(path, 3, model=model, loss=_loss).first
    assert first is not None and first.inf > 0 and first.nan == 0
    # (|y| + 300) squared, summed over two columns: over 65504 (fp16's largest), from inputs under it
    assert all(i.dtype == "float16" and 300 <= i.low and i.high < 65504 for i in first.inputs)


def test_the_loss_comes_back_bit_for_bit_with_dropout(tmp_path: Path) -> None:
    # the custom backward leaves the loss finite: reproduced means the same bits, dropout's mask included
    model, path = _train_logged(tmp_path, "backward")
    r = replay(path, 3, model=model, loss=_loss)
    recorded = inspector.read_run(path).steps.set_index("step").loc[3, "loss"]
    assert r.loss is not None and struct.pack("<d", r.loss) == struct.pack("<d", float(recorded))
    assert r.reproduced is True and r.tolerance == 0.0
    assert r.gradients_match is True and r.grad_norm != r.grad_norm  # NaN, as the run recorded
    # another loss function gives another loss: the comparison can fail
    other = replay(path, 3, model=model, loss=lambda out, x: out.pow(2).sum())
    assert other.reproduced is False
    assert any(f.code == "replay-differs" for f in other.findings)


def test_captures_and_gradients_are_those_of_the_replayed_step(tmp_path: Path) -> None:
    model, path = _train_logged(tmp_path, "backward")
    r = replay(path, 3, model=model, loss=_loss)
    assert {"fc1", "drop", "block", "block.fc2"} <= set(r.captures.outputs)
    assert r.captures.outputs["fc1"].shape == (16, 8)
    assert "block" in r.captures.inputs  # the producer's inputs are kept
    states = dict(zip(r.gradients["name"], r.gradients["state"], strict=True))
    assert states["block.fc2.weight"] == "nonfinite" and states["fc1.weight"] == "nonfinite"


def test_the_model_is_as_it_was_after_a_replay(tmp_path: Path) -> None:
    model, path = _train_logged(tmp_path, "log")
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    model.eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad for p in model.parameters()]
    ids = [id(p) for p in model.parameters()]
    rng = torch.get_rng_state()
    calls = model.calls
    replay(path, 3, model=model, loss=_loss)
    after = model.state_dict()
    assert all(
        torch.equal(before[k].view(torch.int32), after[k].view(torch.int32)) for k in before
    )  # NaNs too
    assert [p.grad for p in model.parameters()] == grads and [id(p) for p in model.parameters()] == ids
    assert not model.training and not model.fc1.training
    assert model.calls == calls  # the forward's own counter is put back
    assert torch.equal(torch.get_rng_state(), rng)
    assert not model._forward_hooks and not model._forward_pre_hooks and not model.fc1._forward_hooks


def test_a_healthy_run_writes_no_replay_file_and_keeps_no_weights(tmp_path: Path) -> None:
    path = tmp_path / "run.inspect"
    torch.manual_seed(0)
    model = Planted("")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, opt, path, keep=True) as w:
        for _ in range(30):
            x = torch.randn(16, 4)
            loss = _loss(model(x), x)
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
            assert len(w.keeper.kept) <= 2  # the last two steps, no more
            assert all(s.weights is None for s in w.keeper.kept)  # no copy on a healthy step
    assert replay_files(path) == [] and w.keeper.written == [] and w.keeper.copies == 0
    with pytest.raises(InspectorError, match=r"step 4 of run.inspect was not kept"):
        replay(path, 4, model=model)


def test_a_byte_budget_too_small_writes_nothing_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "run.inspect"
    torch.manual_seed(0)
    model = Planted("log")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, opt, path, keep=True, keep_bytes=100) as w:
        for _ in range(5):
            x = torch.randn(16, 4)
            loss = _loss(model(x), x)
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    assert replay_files(path) == []
    assert any("keep_bytes" in n and "step 3" in n for n in w.keeper.notes)


def test_a_step_that_was_not_kept_lists_the_kept_ones(tmp_path: Path) -> None:
    model, path = _train_logged(tmp_path, "log")
    with pytest.raises(
        InspectorError,
        match=r"step 0 of run.inspect was not kept with its weights.*2 \(no "
        r"weights\), 3",
    ):
        replay(path, 0, model=model)


def test_a_replay_file_of_another_model_is_refused_naming_the_difference(tmp_path: Path) -> None:
    _, path = _train_logged(tmp_path, "log")
    with pytest.raises(
        InspectorError,
        match=r"run.inspect.step3.replay.safetensors holds the weights of another "
        r"model.*'fc1.weight'",
    ):
        replay(path, 3, model=nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)))
    wider = Planted("log")
    wider.fc1 = nn.Linear(4, 9)
    wider.block.fc2 = nn.Linear(9, 2)
    with pytest.raises(
        InspectorError,
        match=r"step3.replay.safetensors: fc1.weight has shape \[8, 4\] there and "
        r"\[9, 4\] in this model",
    ):
        replay(path, 3, model=wider)


def test_a_truncated_replay_file_is_refused(tmp_path: Path) -> None:
    model, path = _train_logged(tmp_path, "log")
    f = replay_files(path)[0]
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    with pytest.raises(
        InspectorError,
        match=r"replay file run.inspect.step3.replay.safetensors was refused: it is "
        r"not a readable safetensors file",
    ):
        replay(path, 3, model=model)
    f.write_bytes(data[:20])
    with pytest.raises(InspectorError, match=r"step3.replay.safetensors was refused: its header claims"):
        replay(path, 3, model=model)


def _rewrite(f: Path, change: Any) -> None:
    """The file with its record changed by ``change(record)`` (the tensors kept)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(f), framework="pt") as fh:
        meta = dict(fh.metadata())
    record = json.loads(meta["replay"])
    tensors = load_file(str(f))
    change(record, tensors)
    meta["replay"] = json.dumps(record)
    save_file(tensors, str(f), metadata=meta)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r, t: r.update(step="3"), "its step is not a whole number"),
        (lambda r, t: r.update(extra=1), "does not have exactly the fields"),
        (
            lambda r, t: r["steps"][-1]["calls"][0]["args"].update(t="s3/c0/t9"),
            "the tensor 's3/c0/t9' it names is missing",
        ),
        (
            lambda r, t: r["steps"][-1]["calls"][0].update(args={"call": ["os.system", {"t": "s3/c0/t0"}]}),
            "a call's structure has a node of kind 'call'",
        ),
        (
            lambda r, t: t.update({"s3/c0/extra": torch.zeros(1)}),
            "holds the tensor 's3/c0/extra' that its record",
        ),
        (
            lambda r, t: t.update({"s3/c0/rng/cpu": torch.zeros(3)}),
            "generator state 's3/c0/rng/cpu' is not a flat uint8",
        ),
    ],
)
def test_a_forged_replay_file_is_refused_naming_what_is_wrong(
    tmp_path: Path, change: Any, message: str
) -> None:
    model, path = _train_logged(tmp_path, "log")
    f = replay_files(path)[0]
    _rewrite(f, change)
    with pytest.raises(InspectorError, match=f"run.inspect.step3.replay.safetensors.*{_escape(message)}"):
        replay(path, 3, model=model)


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def test_a_model_spec_that_does_not_build_is_named(tmp_path: Path) -> None:
    _, path = _train_logged(tmp_path, "log")
    with pytest.raises(
        InspectorError,
        match=r"replay of .*run.inspect: the model 'sample:no-such-model' did not "
        r"build",
    ):
        replay(path, 3, model="sample:no-such-model")


def test_the_file_record_reads_back_as_written(tmp_path: Path) -> None:
    _, path = _train_logged(tmp_path, "div")
    f = ReplayFile(replay_files(path)[0])
    assert f.meta.step == 3 and f.meta.model == "Planted" and f.meta.rank == 0
    assert [s.step for s in f.meta.steps] == [2, 3] and [s.weights for s in f.meta.steps] == [False, True]
    assert f.meta.parameters == ("fc1.weight", "fc1.bias", "block.fc2.weight", "block.fc2.bias")
    assert {c for c, *_ in f.meta.findings} >= {"nonfinite-loss"}
    assert f.meta.steps[-1].calls[0].rng.keys() == {"cpu"}


def test_a_nan_made_in_the_loss_function_is_named_in_the_loss(tmp_path: Path) -> None:
    model, path = _train_logged(tmp_path, "backward")  # a finite forward: the loss given makes the NaN

    def entropy_loss(out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        p = torch.zeros(())
        return out.pow(2).mean() + p * torch.log(p)  # PLANT:loss

    first = replay(path, 3, model=model, loss=entropy_loss).first
    assert first is not None
    assert (first.phase, first.op, first.module) == ("forward", "aten.log.default", "(loss)")
    assert first.source == _line("# PLANT:loss") and first.inf == 1


def test_a_replay_inside_the_watch_block_is_refused(tmp_path: Path) -> None:
    model, path = _train_logged(tmp_path, "log")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with watch(model, opt, tmp_path / "again.inspect", keep=True):
        with pytest.raises(InspectorError, match=r"the model is being watched with keep=True"):
            replay(path, 3, model=model)


def test_keep_weights_copies_every_step_and_the_step_before_replays_clean(tmp_path: Path) -> None:
    model, path = _train_logged(tmp_path, "log", keep_weights=True)
    f = ReplayFile(replay_files(path)[0])
    assert [(s.step, s.weights) for s in f.meta.steps] == [(2, True), (3, True)]
    model.at = 10**6  # the plant off, as it was at step 2 (it follows the model's own call counter)
    r = replay(path, 2, model=model, loss=_loss)  # the healthy step before the plant, with its own weights
    assert r.reproduced is True and r.ops == () and r.loss is not None and r.loss == r.loss
    # a finite step: the total gradient norm is the run's, up to the order of the sum
    assert r.gradients_match is True and r.grad_norm is not None and r.grad_norm > 0
    recorded = inspector.read_run(path).steps.set_index("step").loc[2, "grad_norm"]
    assert r.grad_norm == pytest.approx(float(recorded), rel=1e-6)


def test_a_replay_file_that_links_outside_the_run_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    model, path = _train_logged(tmp_path / "a", "log")
    outside = tmp_path / "elsewhere.safetensors"
    f = replay_files(path)[0]
    f.rename(outside)
    f.symlink_to(outside)
    with pytest.raises(InspectorError, match=r"is a link that leads outside"):
        replay(path, 3, model=model)
    assert inspector.replaying.kept_steps(path) == []  # the steps a page lists leave it out


class Masked(nn.Module):
    """An attention-like block: a causal mask of -inf (a constant, not a culprit), then, planted, x * inf."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.zeros(3, 3).masked_fill(torch.ones(3, 3).triu(1).bool(), float("-inf"))
        limit = torch.tensor(float("-inf"))
        weights = torch.softmax(torch.maximum(x + mask, limit), -1)
        return weights * float("inf")  # PLANT:inf-scalar


def test_an_infinite_mask_is_not_a_culprit_and_a_product_with_inf_is() -> None:
    from inspector.replaying import finding_ops

    model = Masked()
    with finding_ops(model) as finder:
        model(torch.randn(3, 3))
    assert [(o.op, o.module, o.source) for o in finder.found] == [
        ("aten.mul.Tensor", "(model)", _line("# PLANT:inf-scalar"))]
    assert not model._forward_hooks and not model._forward_pre_hooks


def test_a_parameter_without_gradient_keeps_the_healthy_run_quiet(tmp_path: Path) -> None:
    import warnings

    # the first layer never takes part: its norms are missing at every step, a column of NaN
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(4, 4), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "All-NaN slice" would be one a step
        with watch(model, opt, tmp_path / "r.inspect", keep=True) as w:
            for _ in range(15):
                loss = model[2](model[1](torch.randn(8, 4))).pow(2).mean()
                loss.backward()
                w.log(loss=loss)
                opt.step()
                opt.zero_grad()
    assert w.keeper.copies == 0 and w.keeper.written == []
