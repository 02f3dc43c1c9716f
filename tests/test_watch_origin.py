"""The origin first, on two gloo ranks: the rank whose batch, loss or forward went non-finite leads the
findings, the stop line and the verdict; under the Trainer each rank's own loss is read; a drift between
two copies names both and says what would tell them apart."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
import torch
from ranks import init, leave, spawn_ranks
from torch import nn


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 1))


def _torchrun_env(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(world), RANK=str(rank),
                      LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world), GROUP_RANK="0", NODE_RANK="0",
                      TORCHELASTIC_RUN_ID="test")


def _lightning_worker(rank: int, world: int, port: int, out: str) -> None:
    """Lightning's DDP, default options (no trace): a NaN in rank 1's batch at step 2."""
    import pytorch_lightning as pl

    from inspector.integrations import LightningWatch

    torch.set_num_threads(1)
    _torchrun_env(rank, world, port)

    class Poisoned(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()

        def training_step(self, batch, batch_idx):
            x = batch[0].clone()
            if self.global_rank == 1 and batch_idx == 2:
                x[0, 0] = float("nan")
            return self.net(x).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(24, 4)), batch_size=2)
    callback = LightningWatch(Path(out) / "pl.inspect", stop_on_error=True, report=None)
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy="ddp", max_steps=8, callbacks=[callback],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, use_distributed_sampler=False)
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            trainer.fit(Poisoned(), data)
    finally:
        (Path(out) / f"pl{rank}.json").write_text(json.dumps({"steps": trainer.global_step,
                                                             "printed": printed.getvalue()}))
        leave()


def test_lightning_nan_in_rank_1s_batch_stops_naming_rank_1s_origin(tmp_path):
    pytest.importorskip("pytorch_lightning")
    spawn_ranks(_lightning_worker, 2, str(tmp_path), timeout=240)
    from inspector import read_run
    from inspector.watching import verdict

    on = [json.loads((tmp_path / f"pl{r}.json").read_text()) for r in (0, 1)]
    assert on[0]["steps"] == on[1]["steps"] == 3  # both stopped after step 2
    run = read_run(tmp_path / "pl.inspect")
    first = verdict(run).first
    # the cause: rank 1's loss (Lightning calls training_step, not the module's forward, so the batch is
    # not read); rank 0's NaN gradients, brought by the gradient reduction, follow it
    assert (first.step, first.rank, first.code) == (2, 1, "nonfinite-loss")
    assert "First error: step 2 rank 1 · nonfinite-loss at (loss)" in verdict(run).line()
    ordered = [(f.rank, f.code) for f in run.findings if f.step == 2]
    assert ordered[0] == (1, "nonfinite-loss") and (0, "nonfinite-gradient") in ordered[1:]
    [line] = [ln for ln in on[0]["printed"].splitlines() if "training stopped" in ln]
    assert "training stopped at step 2 on rank 1: nonfinite-loss at (loss)" in line
    assert "training stopped" not in on[1]["printed"]  # rank 0 says it, once


def _trainer_worker(rank: int, world: int, port: int, out: str) -> None:
    """The HF Trainer under DDP (gloo, CPU): rank 1's forward overflows at its third step (its samples hold
    values near float32's largest, so the squared error is Inf); rank 0's stays finite."""
    import transformers

    from inspector.integrations import WatchCallback

    torch.set_num_threads(1)
    _torchrun_env(rank, world, port)

    class Tiny(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()

        def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
            out = self.net(x).squeeze(-1)
            return {"loss": ((out - labels) ** 2).mean(), "logits": out}

    class Rows(torch.utils.data.Dataset):
        """Whichever samples the sampler gives this rank: rank 1's fifth and sixth (its batch 2) have labels
        of 3e38, whose squared error overflows to Inf."""

        fetched = 0

        def __len__(self) -> int:
            return 32

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            big, Rows.fetched = rank == 1 and Rows.fetched in (4, 5), Rows.fetched + 1
            return {"x": torch.ones(4) * (i % 3), "labels": torch.tensor(3e38 if big else float(i % 2))}

    losses: list[float] = []

    class Losses(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                losses.append(logs["loss"])

    args = transformers.TrainingArguments(
        output_dir=str(Path(out) / f"out{rank}"), per_device_train_batch_size=2, learning_rate=0.01,
        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, max_grad_norm=0.0,
        seed=0, max_steps=4, ddp_backend="gloo", dataloader_num_workers=0)
    trainer = transformers.Trainer(model=Tiny(), args=args, train_dataset=Rows())
    callback = WatchCallback(Path(out) / "hf.inspect", report=None)
    trainer.add_callback(callback)
    trainer.add_callback(Losses())
    try:
        trainer.train()
    finally:
        (Path(out) / f"hf{rank}.json").write_text(json.dumps({"logged": losses}))
        leave()


def test_trainer_overflow_in_rank_1s_forward_is_named_on_rank_1(tmp_path):
    pytest.importorskip("transformers")
    spawn_ranks(_trainer_worker, 2, str(tmp_path), timeout=240)
    from inspector import read_run
    from inspector.watching import verdict

    run = read_run(tmp_path / "hf.inspect")
    at2 = [f for f in run.findings if f.step == 2]
    assert at2 and at2[0].rank == 1 and at2[0].code == "nonfinite-loss"  # rank 1's own loss, first
    assert all("backward pass made them" not in f.message for f in run.findings)
    spread = [f for f in at2 if f.code == "nonfinite-gradient" and "start at the loss of rank 1" in f.message]
    assert spread  # the distributed check names rank 1's loss too
    first = verdict(run).first
    assert (first.step, first.rank, first.code) == (2, 1, "nonfinite-loss")
    # each rank's own loss at each step: rank 1's Inf at step 2, rank 0's finite
    loss = run.steps.set_index(["step", "rank"])["loss"]
    assert loss[(2, 1)] == float("inf") and abs(loss[(2, 0)]) < 10
    logged = json.loads((tmp_path / "hf0.json").read_text())["logged"]
    for step in (0, 1):  # the Trainer logs the mean of the ranks' losses, which differ
        assert loss[(step, 0)] != loss[(step, 1)]
        assert abs((loss[(step, 0)] + loss[(step, 1)]) / 2 - logged[step]) < 1e-5


def _drift_worker(rank: int, world: int, port: int, out: str) -> None:
    """A plain model (no DDP) on 2 ranks: rank 0's copy of a weight is edited at step 1."""
    from inspector import watch

    torch.set_num_threads(1)
    init(rank, world, port)
    try:
        model = _net()
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        with watch(model, opt, Path(out) / "drift.inspect"):
            for step in range(2):
                if rank == 0 and step == 1:
                    with torch.no_grad():
                        model[2].bias.add_(1.0)
                model(torch.ones(2, 4)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
    finally:
        leave()


def test_drift_between_two_copies_names_both_and_no_broadcast_from_rank_0(tmp_path):
    spawn_ranks(_drift_worker, 2, str(tmp_path), timeout=180)
    from inspector import read_run

    run = read_run(tmp_path / "drift.inspect")
    [drift] = [f for f in run.findings if f.code == "replica-drift"]
    assert (drift.step, drift.where) == (1, "2.bias")
    assert "ranks 0 and 1 hold different values" in drift.message
    assert "broadcast it from rank 0" not in drift.message
    for check in ("optimizer state", "third replica", "checkpoint"):
        assert check in drift.message
