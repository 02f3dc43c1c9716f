"""The watch inside PyTorch Lightning: automatic and manual optimisation, several optimizers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from inspector import read_run
from inspector.integrations import LightningWatch

pl = pytest.importorskip("pytorch_lightning")


def data(n: int = 8, poison: int | None = None) -> torch.utils.data.DataLoader:
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 4, generator=g), torch.arange(n, dtype=torch.float32) % 3
    if poison is not None:
        x[poison, 0] = float("inf")  # the update made from this sample turns lin1.weight non-finite
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=2)


class Auto(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin1, self.lin2 = nn.Linear(4, 3), nn.Linear(3, 1)
        self.losses: list[float] = []

    def loss(self, batch):
        x, y = batch
        return ((self.lin2(torch.relu(self.lin1(x))).squeeze(-1) - y) ** 2).mean()

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


class Manual(Auto):
    """Two optimizers, one per layer, stepped one after the other on every batch (a GAN's pattern)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        for opt in self.optimizers():
            loss = self.loss(batch)
            self.losses.append(float(loss.detach()))
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

    def configure_optimizers(self):
        return [torch.optim.SGD(self.lin1.parameters(), lr=0.05),
                torch.optim.SGD(self.lin2.parameters(), lr=0.05)]


def fit(module, callback, tmp_path, loader=None, **kw):
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[callback], **kw)
    trainer.fit(module, loader if loader is not None else data())
    return trainer


def unhooked(module) -> bool:
    return not any(m._forward_pre_hooks or m._forward_hooks for m in module.modules())


def test_automatic_optimisation_records_each_step_with_its_loss(tmp_path):
    module = Auto()
    cb = LightningWatch(tmp_path / "auto.inspect", report=None)
    trainer = fit(module, cb, tmp_path)
    run = read_run(tmp_path / "auto.inspect")
    # 8 samples, 2 a batch: 4 steps, each with the loss its training_step returned
    assert len(run.steps) == 4 == trainer.global_step and run.complete and cb.result.completed
    np.testing.assert_allclose(run.steps.loss.to_numpy(), module.losses, rtol=1e-6)
    assert unhooked(module) and not trainer.optimizers[0]._optimizer_step_post_hooks


def test_gradient_accumulation_gives_one_step_per_update(tmp_path):
    module = Auto()
    fit(module, LightningWatch(tmp_path / "acc.inspect", report=None), tmp_path, accumulate_grad_batches=2)
    assert len(read_run(tmp_path / "acc.inspect").steps) == 2  # 4 batches, 2 per update


def test_manual_optimisation_with_two_optimizers(tmp_path):
    module = Manual()
    fit(module, LightningWatch(tmp_path / "two.inspect", report=None), tmp_path)
    run = read_run(tmp_path / "two.inspect")
    assert len(run.steps) == 4 and not run.findings  # 4 batches: the first optimizer's steps, nothing wrong
    assert run.steps.filter(like="lr_").shape[1] == 2  # both optimizers' learning rates
    # follow only the first optimizer: one step per batch
    fit(Manual(), LightningWatch(tmp_path / "first.inspect", optimizer=0, report=None), tmp_path)
    assert len(read_run(tmp_path / "first.inspect").steps) == 4


def test_stop_on_error_stops_the_fit_naming_the_module(tmp_path, capsys):
    module = Auto()
    cb = LightningWatch(tmp_path / "stop.inspect", stop_on_error=True)
    trainer = fit(module, cb, tmp_path, loader=data(12, poison=4))  # batch 2 holds the Inf
    run = read_run(tmp_path / "stop.inspect")
    assert trainer.global_step == 3 and len(run.steps) == 3 and not cb.result.completed
    assert run.findings[0].step == 2 and run.findings[0].where.startswith("lin1")
    assert "training stopped at step 2" in capsys.readouterr().out


class OneStepped(Manual):
    def training_step(self, batch, batch_idx):
        opt1, _ = self.optimizers()
        loss = self.loss(batch)
        opt1.zero_grad()
        self.manual_backward(loss)
        opt1.step()  # the second optimizer's step is forgotten: lin2 never trains


def test_manual_optimisation_names_an_optimizer_that_never_steps(tmp_path):
    """Its zero_grad() is forgotten too: lin2's gradients only pile up (as a generator's may between its
    steps), so it is named once they have been there at 10 steps (steps 0 to 9)."""
    fit(OneStepped(), LightningWatch(tmp_path / "one.inspect", report=None), tmp_path, loader=data(24))
    run = read_run(tmp_path / "one.inspect")
    assert [(f.step, f.code, f.where) for f in run.findings] == [(9, "optimizer-not-stepped", "lin2.weight")]


class Broken(Auto):
    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            raise RuntimeError("bad batch")
        return super().training_step(batch, batch_idx)


def test_an_exception_closes_the_file_and_removes_the_hooks(tmp_path):
    module = Broken()
    cb = LightningWatch(tmp_path / "broken.inspect", report=None)
    with pytest.raises(RuntimeError, match="bad batch"):
        fit(module, cb, tmp_path)
    run = read_run(tmp_path / "broken.inspect")
    assert len(run.steps) == 2 and not cb.result.completed and unhooked(module)
    # the file says how the run ended: not complete, the exception at the step it was in
    assert not run.complete and run.failure is not None and run.failure.step == 2
    assert "RuntimeError: bad batch" in run.failure.message


def test_gradient_norms_are_those_of_each_steps_own_batch(tmp_path):
    """Lightning runs forward, zero_grad and backward inside optimizer.step(closure): the numbers of a
    step are read when the closure returns, so step k holds batch k's gradient (not batch k-1's)."""
    module = Auto()
    expected = []
    for x, y in data():  # the weights do not change below (lr 0): each batch's gradient norm by hand
        module.zero_grad()
        module.loss((x, y)).backward()
        expected.append(float(torch.cat([p.grad.flatten() for p in module.parameters()]).norm()))
    module.configure_optimizers = lambda: torch.optim.SGD(module.parameters(), lr=0.0)
    fit(module, LightningWatch(tmp_path / "norms.inspect", report=None), tmp_path)
    np.testing.assert_allclose(read_run(tmp_path / "norms.inspect").steps.grad_norm, expected, rtol=1e-5)


def test_bf16_mixed_precision_on_cpu(tmp_path):
    module = Auto()
    trainer = fit(module, LightningWatch(tmp_path / "bf16.inspect", report=None), tmp_path,
                  precision="bf16-mixed")
    run = read_run(tmp_path / "bf16.inspect")
    assert len(run.steps) == 4 == trainer.global_step and np.isfinite(run.steps.grad_norm).all()
    np.testing.assert_allclose(run.steps.loss.to_numpy(), module.losses, rtol=1e-6)
