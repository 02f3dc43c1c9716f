"""Keeping steps inside a training stack: Hugging Face's Trainer with ``WatchCallback(keep=True)`` and an
accelerate loop with ``watch_accelerator(..., keep=True)`` (each hands its options to the watch) keep the
step whose batch held an Inf, and the replay finds it.
The Trainer logs its loss after the update, so a replayed step has no recorded loss to compare with."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from inspector import replay
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
    # the Trainer logs its loss after the update, onto the next step: this step has none to compare with
    assert r.reproduced is None and r.recorded_loss is None
    assert r.gradients_match is True  # NaN gradients, as the run recorded: the step did come back


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
