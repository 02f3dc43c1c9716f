"""Two gloo ranks on the CPU watch one DDP model and join the same run file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
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
    codes = {f.code for f in run.findings}
    assert "nonfinite-gradient" in codes  # check_step's own findings join the record
    on0, on1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert on0 == on1 and [2, 1, "nonfinite-forward"] in [
        f[:3] for f in on1
    ]  # every rank knows every finding
    assert [tuple(f[:3]) for f in on0] == [(f.step, f.rank, f.code) for f in run.findings]
    found = [(f.step, f.rank, f.code, f.where) for f in run.findings]
    # each rank's own finding is kept even when another rank had the same one
    assert (2, 0, "nonfinite-parameter", "a.weight") in found and (
        2,
        1,
        "nonfinite-parameter",
        "a.weight",
    ) in found


class Two(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 6)
        self.down = nn.Linear(6, 4)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _sharded(kind: str, world: int) -> nn.Module:
    torch.manual_seed(0)
    model = Two()
    if kind == "replica":
        return model
    if kind == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(model.up)
        return fully_shard(model)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,))
    return parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})


def _sharded_worker(rank: int, world: int, port: int, out: str) -> None:
    from inspector import watch

    init(rank, world, port)
    try:
        xs = torch.randn(3, 5, 4, generator=torch.Generator().manual_seed(1))  # the same batches on each rank
        for kind in ("fsdp", "tp", "replica"):
            model = _sharded(kind, world)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            with watch(model, opt, Path(out) / f"{kind}.inspect", update_ratio=True, distributed=False) as w:
                for x in xs:
                    model(x).pow(2).sum().backward()
                    opt.step()
                    opt.zero_grad()
            (Path(out) / f"{kind}-rank{rank}.json").write_text(json.dumps([f.code for f in w.findings]))
    finally:
        leave()


def test_sharded_norms_are_global_like_an_unsharded_replica(tmp_path):
    spawn_ranks(_sharded_worker, 2, str(tmp_path))
    from inspector import read_run

    replica = read_run(tmp_path / "replica.inspect")
    for kind in ("fsdp", "tp"):
        run = read_run(tmp_path / f"{kind}.inspect")
        assert run.meta.modules == replica.meta.modules and run.meta.parameters == replica.meta.parameters
        for rank in (0, 1):  # each rank's row holds the global numbers, not its piece's
            for column in ("grad_norm", "param_norm", "update_ratio"):
                want = replica.matrix(column, 0)[1]
                got = run.matrix(column, rank)[1]
                np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"{kind} rank {rank} {column}")
            p_want = replica.parameters.query("rank == 0")["grad_norm"].to_numpy()
            p_got = run.parameters.query(f"rank == {rank}")["grad_norm"].to_numpy()
            np.testing.assert_allclose(p_got, p_want, rtol=1e-5, err_msg=f"{kind} rank {rank} parameters")
        assert run.steps["grad_norm"].to_numpy() == pytest.approx(
            replica.steps["grad_norm"].to_numpy(), rel=1e-5
        )
