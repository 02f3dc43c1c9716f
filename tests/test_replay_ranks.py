"""Two gloo ranks on the CPU keep their own steps of one DDP run; one rank's step replays in this process."""

from __future__ import annotations

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
        return self.b(h * math.inf if self.poison else h)  # PLANT:rank1


def _worker(rank: int, world: int, port: int, out: str) -> None:
    from inspector import watch

    init(rank, world, port)
    try:
        torch.manual_seed(0)
        net = Net()
        model = nn.parallel.DistributedDataParallel(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        with watch(model, opt, Path(out) / "run.inspect", keep=True):
            for step in range(3):
                net.poison = rank == 1 and step == 2  # only rank 1's forward turns Inf, at step 2
                loss = model(torch.ones(2, 4) * (rank + 1)).pow(2).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
    finally:
        leave()


def test_each_rank_keeps_its_own_step_and_one_replays_in_one_process(tmp_path):
    from inspector import replay
    from inspector.replaying import ReplayFile, replay_files

    spawn_ranks(_worker, 2, str(tmp_path))
    files = replay_files(tmp_path / "run.inspect")
    assert [f.name for f in files] == ["run.inspect.rank0.step2.replay.safetensors",
                                       "run.inspect.rank1.step2.replay.safetensors"]
    assert [ReplayFile(f).meta.rank for f in files] == [0, 1]
    net = Net()
    net.poison = True
    r = replay(tmp_path / "run.inspect", 2, model=net, rank=1)
    first = r.first
    assert first is not None and (first.op, first.module) == ("aten.mul.Tensor", "(model)")
    assert first.source.endswith(f"{Path(__file__).name}:{_line('# PLANT:rank1')}")
    net.poison = False  # rank 0's forward was finite: its NaN came through the reduction of the gradients
    r0 = replay(tmp_path / "run.inspect", 2, model=net, rank=0)
    assert r0.ops == () and r0.weights_nonfinite == () and r0.batch_nonfinite == ()


def _line(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, t in enumerate(lines, 1) if t.rstrip().endswith(marker) and "_line(" not in t)


def test_keeping_steps_of_a_model_with_dtensor_parameters_is_refused_naming_why(world1, tmp_path):
    import pytest
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    from inspector import InspectorError, watch

    mesh = init_device_mesh("cpu", (1,))
    model = nn.Module()
    model.w = nn.Parameter(distribute_tensor(torch.ones(2), mesh, [Replicate()]))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    refused = r"its parameters are DTensors \(FSDP2 or tensor parallel\).*Keep steps on a run .* not sharded"
    with pytest.raises(InspectorError, match=refused):
        with watch(model, opt, tmp_path / "run.inspect", keep=True):
            pass
    assert not model._forward_pre_hooks and not opt._optimizer_step_pre_hooks  # the watch closed cleanly
