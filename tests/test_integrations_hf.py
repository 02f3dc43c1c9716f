"""The watch inside Hugging Face's Trainer and accelerate loops, each run for real on CPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from inspector import read_run
from inspector.integrations import TrainingStopped, WatchCallback, watch_accelerator, watch_trainer

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """accelerate keeps its state in process-wide singletons (accumulation, sync flags): each test
    starts from none, as a new process would (accelerate's own tests reset them the same way)."""
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


def rows(n: int, poison: int | None = None) -> list[dict[str, torch.Tensor]]:
    """``n`` samples; sample ``poison`` holds an Inf, so the update made from it turns lin1.weight
    non-finite (Inf * 0 in the gradient of lin1 gives NaN)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        x = torch.randn(4, generator=g)
        if i == poison:
            x[0] = float("inf")
        out.append({"x": x, "labels": torch.tensor(float(i % 3))})
    return out


def args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, learning_rate=0.05,
                logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
                max_grad_norm=0.0, seed=0)
    base.update(kw)
    return transformers.TrainingArguments(**base)


def no_hooks(model: nn.Module, optimizer: torch.optim.Optimizer) -> bool:
    return (not any(m._forward_pre_hooks or m._forward_hooks for m in model.modules())
            and not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks)


def test_trainer_steps_are_optimizer_updates_and_the_numbers_are_the_trainers(tmp_path):
    model = Tiny()
    # 8 samples, 2 a batch, 2 batches per update: 2 updates an epoch, 4 in 2 epochs
    trainer = transformers.Trainer(model=model, args=args(tmp_path, gradient_accumulation_steps=2,
                                                          num_train_epochs=2), train_dataset=rows(8))
    cb = WatchCallback(tmp_path / "runs" / "hf.inspect", report=None)
    trainer.add_callback(cb)
    trainer.train()
    run = read_run(tmp_path / "runs" / "hf.inspect")
    assert len(run.steps) == trainer.state.global_step == 4 and run.complete
    logged = [h for h in trainer.state.log_history if "loss" in h and "grad_norm" in h]
    # the Trainer's grad_norm of its step k (1-based, no clipping) is the watch's of step k-1
    np.testing.assert_allclose(run.steps.grad_norm.to_numpy(), [h["grad_norm"] for h in logged], rtol=1e-5)
    # each step's own loss (the sum of its batches' training_step losses), the one the Trainer logs for it
    np.testing.assert_allclose(run.steps.loss.to_numpy(), [h["loss"] for h in logged], rtol=1e-5)
    assert "training_step" not in vars(trainer)  # the wrapper is gone
    assert no_hooks(model, trainer.optimizer.optimizer) and cb.result.steps == 4


def test_watch_trainer_records_the_pre_clip_norm_the_trainer_logs(tmp_path):
    model = Tiny()
    # max_grad_norm=0.01: every step is clipped, so a norm read after the clip would be 0.01
    trainer = transformers.Trainer(model=model, args=args(tmp_path, max_steps=4, max_grad_norm=0.01),
                                   train_dataset=rows(8))
    accelerator = trainer.accelerator
    cb = watch_trainer(trainer, tmp_path / "clip.inspect", report=None)
    trainer.train()
    run = read_run(tmp_path / "clip.inspect")
    logged = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    assert len(logged) == len(run.steps) == 4 and min(logged) > 0.1
    np.testing.assert_allclose(run.steps.grad_norm.to_numpy(), logged, rtol=1e-5)
    assert "unscale_gradients" not in accelerator.__dict__ and cb.result.steps == 4  # the wrapper is gone
    assert no_hooks(model, trainer.optimizer.optimizer)


def test_a_callback_added_by_hand_finds_its_trainer_and_records_the_pre_clip_norm(tmp_path):
    """Trainer(callbacks=[WatchCallback(...)]), no watch_trainer: the default max_grad_norm of 1.0 clips
    every step (labels around 20 make the gradient norm far above 1), and the run's grad_norm is still
    the one the Trainer logs, not the 1.0 left after the clip."""
    model = Tiny()
    data = [{**r, "labels": r["labels"] + 20} for r in rows(8)]
    cb = WatchCallback(tmp_path / "hand.inspect", report=None)
    trainer = transformers.Trainer(model=model, args=args(tmp_path, max_steps=4, max_grad_norm=1.0),
                                   train_dataset=data, callbacks=[cb])
    trainer.train()
    run = read_run(tmp_path / "hand.inspect")
    logged = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    assert len(logged) == len(run.steps) == 4 and min(logged) > 5
    np.testing.assert_allclose(run.steps.grad_norm.to_numpy(), logged, rtol=1e-5)
    assert cb.trainer is None and "unscale_gradients" not in trainer.accelerator.__dict__  # wrapper gone
    assert no_hooks(model, trainer.optimizer.optimizer)


def test_trainer_stops_on_the_first_error_naming_the_module(tmp_path, capsys):
    model = Tiny()
    # batch 2 (samples 4, 5) holds the Inf: the third update makes lin1.weight non-finite
    trainer = transformers.Trainer(model=model, args=args(tmp_path, max_steps=6), train_dataset=rows(12, 4))
    cb = WatchCallback(tmp_path / "stop.inspect", stop_on_error=True)
    trainer.add_callback(cb)
    trainer.train()
    assert trainer.state.global_step == 3
    run = read_run(tmp_path / "stop.inspect")
    assert len(run.steps) == 3 and run.complete and not cb.result.completed  # closed, training cut short
    errors = [(f.step, f.code, f.where) for f in run.findings if f.severity == "error"]
    # the Inf is the batch's (read when the forward ends, with default options); then lin1's weights after
    # the update (its gradients, read before the Trainer's clip, are the batch's consequence)
    assert errors[:2] == [(2, "nonfinite-forward", "(batch)"), (2, "nonfinite-parameter", "lin1.weight")]
    err = capsys.readouterr()
    assert "(batch)" in err.err and "training stopped at step 2" in err.out


def test_trainer_bf16_autocast_on_cpu(tmp_path):
    model = Tiny()
    trainer = transformers.Trainer(model=model, args=args(tmp_path, bf16=True, max_steps=3),
                                   train_dataset=rows(8))
    trainer.add_callback(WatchCallback(tmp_path / "bf16.inspect", report=None))
    trainer.train()
    run = read_run(tmp_path / "bf16.inspect")
    assert len(run.steps) == 3 and np.isfinite(run.steps.grad_norm).all() and not run.findings


def test_trainer_with_a_compiled_model(tmp_path):
    model = Tiny()
    trainer = transformers.Trainer(model=model, args=args(tmp_path, max_steps=3, torch_compile=True,
                                                          torch_compile_backend="eager"),
                                   train_dataset=rows(8))
    trainer.add_callback(WatchCallback(tmp_path / "compiled.inspect", report=None))
    trainer.train()
    run = read_run(tmp_path / "compiled.inspect")
    logged = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h]
    assert len(run.steps) == 3 and run.meta.modules == ("lin1", "lin2")
    np.testing.assert_allclose(run.steps.grad_norm.to_numpy(), logged, rtol=1e-5)


class Boom(Tiny):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x, labels=None):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("data loader broke")
        return super().forward(x, labels)


def test_watch_trainer_closes_the_file_when_train_raises(tmp_path):
    model = Boom()
    trainer = transformers.Trainer(model=model, args=args(tmp_path, max_steps=5), train_dataset=rows(12))
    cb = watch_trainer(trainer, tmp_path / "boom.inspect", report=None)
    with pytest.raises(RuntimeError, match="data loader broke"):
        trainer.train()
    run = read_run(tmp_path / "boom.inspect")
    assert len(run.steps) == 2 and not cb.result.completed  # the file was closed, saying how it ended
    assert not run.complete and run.failure.step == 2
    assert "RuntimeError: data loader broke" in run.failure.message
    assert no_hooks(model, trainer.optimizer.optimizer)


def accelerate_loop(tmp_path, poison=None, compile=False, **options):
    acc = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = Tiny()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.utils.data.DataLoader(rows(8, poison), batch_size=2)
    model, opt, data = acc.prepare(model, opt, data)
    if compile:
        model = torch.compile(model, backend="eager")
    losses = []
    with watch_accelerator(acc, model, opt, tmp_path / "acc.inspect", report=None, **options) as w:
        for batch in data:
            with acc.accumulate(model):
                loss = model(**batch)["loss"]
                acc.backward(loss)
                w.log(loss=loss)
                losses.append(float(loss.detach()))
                opt.step()
                opt.zero_grad()
    return model, opt, losses


@pytest.mark.parametrize("compile", [False, True])
def test_accelerate_loop_with_accumulation(tmp_path, compile):
    model, opt, losses = accelerate_loop(tmp_path, compile=compile)
    run = read_run(tmp_path / "acc.inspect")
    # 4 batches, 2 per update: 2 steps; each carries the loss of its last micro-batch
    assert len(run.steps) == 2 and run.complete
    np.testing.assert_allclose(run.steps.loss.to_numpy(), [losses[1], losses[3]], rtol=1e-6)
    assert no_hooks(getattr(model, "_orig_mod", model), opt.optimizer)


def test_accelerate_stop_on_error_raises_naming_the_module(tmp_path):
    # sample 2 (batch 1) holds the Inf: named as the batch's at the first update (batches 0 and 1)
    with pytest.raises(TrainingStopped, match=r"step 0: nonfinite-forward at \(batch\)"):
        accelerate_loop(tmp_path, poison=2, stop_on_error=True)
    assert len(read_run(tmp_path / "acc.inspect").steps) == 1


def test_a_grad_scaler_in_accelerates_optimizer_is_followed(tmp_path):
    """fp16 on a GPU gives the Trainer and accelerate an AcceleratedOptimizer holding a GradScaler;
    on the CPU the same classes are built by hand. The batch with the Inf makes the scaler skip its
    update and halve the scale: the watch records that iteration as a skipped step, with the scale it
    overflowed at, and the next step at the halved scale is a step like any other."""
    from accelerate.optimizer import AcceleratedOptimizer

    from inspector.integrations import WatchedTraining

    accelerate.Accelerator(cpu=True)
    model = Tiny()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    opt = AcceleratedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05), device_placement=False,
                               scaler=scaler)
    session = WatchedTraining(tmp_path / "amp.inspect", report=None)
    session.start(model, opt, scaler=opt.scaler)
    data = rows(8, poison=2)  # batch 1 holds the Inf
    for i in range(0, 8, 2):
        x, y = torch.stack([d["x"] for d in data[i:i + 2]]), torch.stack([d["labels"] for d in data[i:i + 2]])
        scaler.scale(model(x, y)["loss"]).backward()
        opt.step()
        opt.zero_grad()
    session.finish()
    steps = read_run(tmp_path / "amp.inspect").steps
    assert steps.step.tolist() == [0, 1, 2, 3]  # every iteration a row, as the Trainer counts them
    assert steps.scale.tolist() == [1024.0, 1024.0, 512.0, 512.0]
    assert steps.skipped.tolist() == [False, True, False, False]
    plain = Tiny()  # the same first batch without a scaler: the watch reports the unscaled norm
    x, y = torch.stack([d["x"] for d in data[:2]]), torch.stack([d["labels"] for d in data[:2]])
    plain(x, y)["loss"].backward()
    expected = torch.sqrt(sum(p.grad.pow(2).sum() for p in plain.parameters())).item()
    assert steps.grad_norm.iloc[0] == pytest.approx(expected, rel=1e-5)
    assert not opt.optimizer._optimizer_step_post_hooks


def test_the_tensorboard_export_counts_steps_as_the_trainer_does(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from inspector.integrations import TensorBoardExport

    trainer = transformers.Trainer(model=Tiny(), args=args(tmp_path, max_steps=3), train_dataset=rows(8))
    trainer.add_callback(WatchCallback(tmp_path / "tb.inspect", report=None,
                                       export=[TensorBoardExport(logdir=tmp_path / "tb")]))
    trainer.train()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    norms = acc.Scalars("inspector/grad_norm")
    logged = [h for h in trainer.state.log_history if "grad_norm" in h]
    # the Trainer's step k (from 1) and its grad_norm are the export's step k and value
    assert [e.step for e in norms] == [h["step"] for h in logged] == [1, 2, 3]
    np.testing.assert_allclose([e.value for e in norms], [h["grad_norm"] for h in logged], rtol=1e-5)
