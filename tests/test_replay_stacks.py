"""Keeping steps inside a training stack: Hugging Face's Trainer with ``WatchCallback(keep=True)``, an
accelerate loop with ``watch_accelerator(..., keep=True)`` and Lightning with ``LightningWatch(keep=True)``
(each hands its options to the watch) keep the step that broke, and its replay gives the step's loss back
bit for bit on the CPU. The Trainer logs its loss after the update (onto the next step): the replay compares
the model's own loss (``outputs["loss"]``), which the watch keeps with the step."""

from __future__ import annotations

import struct

import pytest
import torch
from torch import nn

from inspector import read_run, replay
from inspector.integrations import WatchCallback
from inspector.replaying import ReplayFile, replay_files

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """accelerate keeps process-wide singletons: each test starts from none, as a new process would."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


class Tiny(nn.Module):
    """4 -> 3 -> 1 with an MSE loss, the way a Trainer wants it: ``forward(x, labels) -> {"loss"}``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin1, self.act, self.lin2 = nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        out = self.lin2(self.act(self.lin1(x)))
        return {"loss": ((out.squeeze(-1) - labels) ** 2).mean(), "logits": out}


class BackwardNaN(torch.autograd.Function):
    """Identity forward; its backward returns NaN: a finite loss with NaN gradients."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("nan")


class Spiky(Tiny):
    """Tiny whose backward makes NaN for a batch holding a value over 100 (its loss stays finite)."""

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        out = self.lin2(self.act(self.lin1(x)))
        if bool((x.abs() > 100).any()):
            out = BackwardNaN.apply(out)
        return {"loss": ((out.squeeze(-1) - labels) ** 2).mean(), "logits": out}


def _bits(x: float | None) -> bytes:
    assert x is not None
    return struct.pack("<d", x)


def _rows(n: int, poison: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        x = torch.randn(4, generator=g)
        if i == poison:
            x[0] = float("inf")
        out.append({"x": x, "labels": torch.tensor(float(i % 3))})
    return out


def test_a_trainer_run_keeps_the_step_and_the_replay_names_the_batch(tmp_path):
    model = Tiny()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, learning_rate=0.05, logging_steps=1,
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, max_grad_norm=0.0, seed=0,
        max_steps=4)
    # sample 4 holds the Inf (the Trainer's sampler, seeded, puts it in the first batch)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_rows(8, 4))
    cb = WatchCallback(tmp_path / "hf.inspect", keep=True, report=None)
    trainer.add_callback(cb)
    trainer.train()
    (kept,) = replay_files(tmp_path / "hf.inspect")  # one episode: the steps after it do not start another
    step = ReplayFile(kept).meta.step
    errors = [f for f in cb.result.findings if f.severity == "error"]
    assert step == errors[0].step and errors[0].where == "(batch)"
    r = replay(tmp_path / "hf.inspect", step, model=model)  # the loss: the model's own outputs["loss"]
    assert r.batch_nonfinite == ("kwargs['x']",)
    first = next(h["loss"] for h in trainer.state.log_history if "loss" in h)  # step 0's, as logged
    assert step == 0 and r.loss == pytest.approx(float(first), rel=1e-3)  # finite: the Inf made NaN gradients
    # the Trainer logs its loss after the update, onto the next step: the step's own loss is compared
    assert r.reproduced is True and _bits(r.recorded_loss) == _bits(r.loss)
    assert r.gradients_match is True  # NaN gradients, as the run recorded: the step did come back


def _trainer(tmp_path, model, rows, steps: int = 6):
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, learning_rate=0.05, logging_steps=1,
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, max_grad_norm=0.0, seed=0,
        max_steps=steps)
    return transformers.Trainer(model=model, args=args, train_dataset=rows)


def test_a_trainer_step_with_a_finite_loss_replays_bit_for_bit(tmp_path):
    rows = _rows(12, -1)
    rows[9]["x"][1] = 1000.0  # finite; its batch's backward makes NaN gradients (a pre-step error: kept)
    model = Spiky()
    trainer = _trainer(tmp_path, model, rows)
    seen: list[float] = []  # each training forward's own loss, as the model returned it
    model.register_forward_hook(
        lambda m, a, out: seen.append(float(out["loss"].detach())) if m.training else None)
    cb = WatchCallback(tmp_path / "hf.inspect", keep=True, report=None)
    trainer.add_callback(cb)
    trainer.train()
    (kept,) = replay_files(tmp_path / "hf.inspect")
    step = ReplayFile(kept).meta.step
    assert step > 0  # a step after the first (the Trainer's own log holds the step before's loss there)
    r = replay(tmp_path / "hf.inspect", step, model=model)
    assert r.batch_nonfinite == () and r.first_in("backward") is not None  # the custom backward's NaN
    assert r.loss is not None and r.loss == r.loss  # finite
    assert r.reproduced is True and _bits(r.loss) == _bits(seen[step])  # the step's own loss, bit for bit
    assert r.recorded_loss == seen[step]
    logged = read_run(tmp_path / "hf.inspect").steps.set_index("step").loc[step, "loss"]
    assert _bits(float(logged)) == _bits(r.loss)  # the run holds each step's own loss (from training_step)


def test_a_lightning_step_replays_bit_for_bit(tmp_path):
    pl = pytest.importorskip("pytorch_lightning")
    from inspector.integrations import LightningWatch

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = Spiky()

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            return self.net(x, labels)

        def training_step(self, batch, batch_idx):
            return self(batch["x"], labels=batch["labels"])["loss"]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    rows = _rows(8, -1)
    rows[5]["x"][2] = 500.0  # batch 2 (no shuffling): NaN gradients at step 2
    module = Module()
    cb = LightningWatch(tmp_path / "pl.inspect", keep=True, report=None)
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[cb])
    trainer.fit(module, torch.utils.data.DataLoader(rows, batch_size=2))
    (kept,) = replay_files(tmp_path / "pl.inspect")
    assert ReplayFile(kept).meta.step == 2
    r = replay(tmp_path / "pl.inspect", 2, model=module)  # the loss: the module's own outputs["loss"]
    logged = read_run(tmp_path / "pl.inspect").steps.set_index("step").loc[2, "loss"]  # before the update
    assert r.reproduced is True and r.loss is not None and _bits(r.loss) == _bits(float(logged))
    assert r.first_in("backward") is not None and r.first_in("forward") is None


def test_an_accelerate_loop_with_accumulation_replays_both_micro_batches(tmp_path):
    from inspector.integrations import watch_accelerator

    acc = __import__("accelerate").Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.DataLoader(_rows(8, 4), batch_size=2)  # sample 4: the first micro-batch of step 1
    model, opt, data = acc.prepare(model, opt, data)
    losses = []
    with watch_accelerator(acc, model, opt, tmp_path / "acc.inspect", report=None, keep=True) as w:
        for batch in data:
            with acc.accumulate(model):
                loss = model(**batch)["loss"]
                acc.backward(loss)
                w.log(loss=loss)  # the step records its last micro-batch's loss
                losses.append(float(loss.detach()))
                opt.step()
                opt.zero_grad()
    (kept,) = replay_files(tmp_path / "acc.inspect")
    assert ReplayFile(kept).meta.step == 1
    r = replay(tmp_path / "acc.inspect", 1, model=model)
    assert r.batch_nonfinite == ("kwargs['x']",)  # the first call's batch
    assert len(r.losses) == 2 and r.losses[1] == losses[3]  # both calls ran; the second is finite
    assert r.reproduced is True and r.gradients_match is True
    assert _bits(r.loss) == _bits(losses[3])
