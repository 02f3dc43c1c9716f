"""Two gloo ranks on the CPU watch one DDP model and join the same run file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from ranks import init, leave, spawn_ranks
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

    init(rank, world, port)
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
        (Path(out) / f"rank{rank}.json").write_text(
            json.dumps([list(f.__dict__.values()) for f in w.findings])
        )
    finally:
        leave()


def test_two_ranks_join_one_file(tmp_path):
    spawn_ranks(_worker, 2, str(tmp_path))
    from inspector import read_run

    run = read_run(tmp_path / "run.inspect")
    assert run.world_size == 2 and run.complete
    assert sorted(zip(run.steps["step"], run.steps["rank"], strict=True)) == [
        (s, r) for s in range(3) for r in (0, 1)
    ]
    # rank 1's batch is twice rank 0's: its local loss is larger before the poison
    first = run.steps[run.steps.step == 0].set_index("rank")["loss"]
    assert first[1] > first[0]
    forward = [(f.step, f.rank, f.where) for f in run.findings if f.code == "nonfinite-forward"]
    assert forward == [(2, 1, "(model)")]  # rank 1's own forward, never rank 0
    # what the Inf did next (every rank's gradients through the reduction, then its weights) is its
    # consequence: at the step the producer is named it is the one finding, on its rank
    assert [(f.step, f.rank, f.code) for f in run.findings if f.step == 2] == [(2, 1, "nonfinite-forward")]
    on0, on1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert on0 == on1 and [2, 1, "nonfinite-forward"] in [
        f[:3] for f in on1
    ]  # every rank knows every finding
    assert [tuple(f[:3]) for f in on0] == [(f.step, f.rank, f.code) for f in run.findings]
