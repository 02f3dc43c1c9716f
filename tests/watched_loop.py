"""A tiny watched training loop for the export tests: an MLP, SGD, and an Inf batch when asked."""

from __future__ import annotations

import torch
from torch import nn

from inspector import read_run
from inspector.integrations import watch_accelerator


def loop(tmp_path, export, steps=4, poison=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with watch_accelerator(None, model, opt, tmp_path / "run.inspect", export=export, report=None,
                           update_ratio=True) as w:
        for i in range(steps):
            x = torch.ones(2, 4) * (i + 1)
            if i == poison:
                x[0, 0] = float("inf")
            loss = model(x).pow(2).mean()
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return read_run(tmp_path / "run.inspect")
