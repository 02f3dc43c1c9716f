"""Two gloo ranks on the CPU watch one DDP model and join the same run file."""

from __future__ import annotations

import json
import math
import socket
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 1)
        self.poison = False

    def forward(self, x):
        h = self.a(x)
        return self.b(h * math.inf if self.poison else h)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    from inspector import watch

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        net = Net()
        model = nn.parallel.DistributedDataParallel(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with watch(model, opt, Path(out) / "run.inspect", nonfinite=True) as w:
            for step in range(3):
                net.poison = rank == 1 and step == 2  # only rank 1's forward turns Inf, at step 2
                loss = model(torch.ones(2, 4) * (rank + 1)).pow(2).mean()
                loss.backward()
                w.log(loss=loss)
                opt.step()
                opt.zero_grad()
        (Path(out) / f"rank{rank}.json").write_text(json.dumps([f.code for f in w.findings]))
    finally:
        dist.destroy_process_group()


def test_two_ranks_join_one_file(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True, start_method="fork")
    from inspector import read_run

    run = read_run(tmp_path / "run.inspect")
    assert run.world_size == 2 and run.complete
    assert sorted(zip(run.steps["step"], run.steps["rank"], strict=True)) == [(s, r) for s in range(3) for r in (0, 1)]
    # rank 1's batch is twice rank 0's: its local loss is larger before the poison
    first = run.steps[run.steps.step == 0].set_index("rank")["loss"]
    assert first[1] > first[0]
    forward = [(f.step, f.rank, f.where) for f in run.findings if f.code == "nonfinite-forward"]
    assert forward == [(2, 1, "(root)")]  # rank 1's own forward, never rank 0
    codes = {f.code for f in run.findings}
    assert "nonfinite-gradient" in codes  # check_step's own findings join the record
    assert not (tmp_path / "rank1.json").read_text().count("nonfinite")  # rank 1 writes nothing; rank 0 reports
