"""More checks for the gloo worlds of tests/distributed_worker.py (2 ranks) and the 4-rank mesh world.

Each function runs on every rank and returns what it saw (JSON-ready); the references are
computed independently here (``full_tensor()`` of every gradient, the bits of the tensors).
Functions that leave the ranks out of step on purpose (a skipped check, a failing model) run last.
"""

from __future__ import annotations

import json
import math
import os
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from ranks import init, leave
from torch import nn


def _try(results: dict, key: str, fn) -> None:
    try:
        results[key] = fn()
    except Exception as exc:  # noqa: BLE001 - recorded for the test to show
        results[key] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()}


def _codes(check) -> list[list[str]]:
    return [[f.code, f.severity, f.where, f.message] for f in check.findings]


class TPBlock(nn.Module):
    """LayerNorm (8) -> Linear(8, 16) -> ReLU -> Linear(16, 8): 16 + 144 + 136 = 296 parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)     # FSDP on the dp dimension only: one copy per tp rank
        self.up = nn.Linear(8, 16)      # ColwiseParallel: Shard(0) on tp
        self.down = nn.Linear(16, 8)    # RowwiseParallel: weight Shard(1), bias Replicate() on tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(self.norm(x))))


def fsdp_tp(dp: int, tp: int) -> dict:
    """FSDP2 over tensor parallelism on a (dp, tp) mesh: every number against full_tensor()."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import inspector
    from inspector.distributed import check_step
    from inspector.offsets import gradient_report

    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = parallelize_module(TPBlock(), mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(10 + mesh["dp"].get_local_rank()))
    model(x).pow(2).sum().backward()
    full = {n: p.grad.full_tensor() for n, p in model.named_parameters()}  # the reference
    res = {"reference": math.sqrt(sum(float(g.double().pow(2).sum()) for g in full.values())),
           "reference_rows": {n: float(g.double().norm()) for n, g in full.items()},
           "placements": {n: str(p.placements) for n, p in model.named_parameters()}}
    check = check_step(model, 0, path=None)
    res["check_total"] = check.record["global"]["grad_norm"]
    res["check_rows"] = {t["name"]: t["grad_norm"] for t in check.record["tensors"]}
    res["keys"] = {t["name"]: t["replica_key"] for t in check.record["tensors"]}
    res["findings"] = _codes(check)
    res["report_total"] = gradient_report(model).total_norm
    table = inspector.placement_table(model)
    res["bytes_per_rank"] = {n: {str(k): v for k, v in b.items()}
                             for n, b in zip(table["name"], table["bytes_per_rank"], strict=True)}
    if dist.get_rank() == dist.get_world_size() - 1:  # the last rank's copy of a dp-only parameter drifts
        with torch.no_grad():
            model.norm.weight.to_local()[0] += 1e-3
    res["drift"] = _codes(check_step(model, 1, path=None))
    return res


def ddp_batchnorm(rank: int) -> dict:
    """DDP with BatchNorm: buffers differ after each forward and are copied from rank 0 at the next."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from inspector.distributed import check_step

    res = {}
    for broadcast in (True, False):
        torch.manual_seed(0)
        model = DDP(nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4)), broadcast_buffers=broadcast)
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(rank))  # each rank its own batch
        model(x).sum().backward()
        first = check_step(model, 0, path=None)
        model.eval()
        with torch.no_grad():
            model(x)  # broadcast_buffers=True: rank 0's running statistics reach every rank here
        after = check_step(model, 1, path=None)
        res[str(broadcast)] = {"first": _codes(first), "after_forward": _codes(after),
                               "mean": model.module[1].running_mean.tolist()}
    return res


def nonfinite(rank: int) -> dict:
    """An Inf written into rank 1's FSDP shard; a NaN batch on rank 1 under DDP (with loss=)."""
    from distributed_worker import _backward, _fsdp_model
    from torch.nn.parallel import DistributedDataParallel as DDP

    from inspector.distributed import check_step

    res = {}
    model = _fsdp_model()
    if rank == 1:
        with torch.no_grad():
            model.blocks[0].fc1.weight.to_local()[0, 0] = float("inf")
    _backward(model)
    check = check_step(model, 0, path=None)
    res["inf_shard"] = _codes(check)
    res["inf_shard_grad_nonfinite"] = sum(
        1 for t in check.record["tensors"] if any(t["nan"]) or any(t["inf"])
    )
    torch.manual_seed(0)
    ddp = DDP(nn.Linear(4, 2))
    x = torch.ones(3, 4) * (float("nan") if rank == 1 else 1.0)
    loss = ddp(x).pow(2).sum()
    loss.backward()
    res["nan_loss"] = _codes(check_step(ddp, 0, path=None, loss=loss))
    return res


def far_off(rank: int) -> dict:
    """Rank 1 scales its FSDP gradient pieces by 0.01: with 2 ranks no majority says which is off."""
    from distributed_worker import _backward, _fsdp_model

    from inspector.distributed import check_step

    model = _fsdp_model()
    _backward(model)
    if rank == 1:
        with torch.no_grad():
            for p in model.parameters():
                p.grad.to_local().mul_(0.01)
    local = [p.grad.to_local() for p in model.parameters()]
    rms = math.sqrt(sum(float(g.double().pow(2).sum()) for g in local) / sum(g.numel() for g in local))
    every: list = [None] * dist.get_world_size()
    dist.all_gather_object(every, rms)
    return {"findings": _codes(check_step(model, 0, path=None)), "rms": every}


class Held(nn.Module):
    """Two plain buffers every rank must hold identically: 40,000 elements (read in parts) and 6."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("big", torch.linspace(-1.0, 1.0, 40_000))
        self.register_buffer("small", torch.tensor([0.5, 1.5, 2.5, 3.5, 4.5, 5.5]))


def hash_edits(rank: int) -> dict:
    """Edits two int64 sums (of all elements, and of every other one) cannot see, on rank 1 only."""
    from inspector.distributed import PARTS, check_step

    model = Held()
    if rank == 1:
        with torch.no_grad():
            big = model.big
            big[[30_000, 30_002]] = big[[30_002, 30_000]].clone()  # swapped, same parity
            bits = model.small.view(torch.int32)
            bits[1] += 1   # +1 ulp
            bits[3] -= 1   # -1 ulp
    calls = []
    for step in range(PARTS):
        found = check_step(model, step, path=None).findings
        calls.append(sorted(f.where for f in found if f.code == "replica-drift"))
    return {"calls": calls, "parts": PARTS}


def report_on_fsdp(rank: int) -> dict:
    """build_report with its default options on an FSDP2 model: no deepcopy of a sharded module."""
    from distributed_worker import _fsdp_model

    import inspector
    from inspector import LoadedModel
    from inspector.aliases import conversion_check
    from sample_models.fsdp import example_inputs, loss

    model = _fsdp_model()
    loaded = LoadedModel(model, "fsdp", "sample_models/fsdp.py:build", inputs_fn=example_inputs, loss_fn=loss)
    rep = inspector.build_report(loaded, attribution_steps=4)
    sections = {s.id: [s.status, s.note] for s in rep.sections}
    return {"sections": sections, "deepcopy": conversion_check(model, "deepcopy").error}


def tp_capture(rank: int, world: int) -> dict:
    """capture_activations of a tensor-parallel model: which captures are this rank's piece."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import inspector

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    model = parallelize_module(TPBlock(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    before = sum(len(m._forward_hooks) for m in model.modules())
    caps = inspector.capture_activations(model, x)
    torch.manual_seed(0)
    plain = TPBlock()
    reference = plain.up(plain.norm(x))  # the whole output of up, computed on one process
    hooks = sum(len(m._forward_hooks) for m in model.modules())
    return {
        "placements": dict(caps.placements),
        "shapes": {k: list(v.shape) for k, v in caps.outputs.items()},
        "findings": [[f.code, f.where, f.message] for f in caps.findings],
        "piece_matches": bool(
            torch.allclose(caps.outputs["up"], reference.chunk(world, -1)[rank], atol=1e-6)
        ),
        "down_matches": bool(torch.allclose(caps.outputs["down"], plain(x), atol=1e-5)),
        "hooks": [before, hooks],
    }


def skipped_call(rank: int) -> dict:
    """DDP; rank 1 skips the check at step 1. Rank 0 must say so within the timeout, never hang."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from inspector.distributed import check_step

    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 2))
    res: dict = {}

    def step(i: int) -> object:
        model(torch.ones(2, 4)).sum().backward()
        if (rank, i) in ((1, 1), (0, 2)):  # rank 1 skips step 1; rank 0 has said so and stops checking
            return "skipped"
        return len(check_step(model, i, path=None, timeout=1.0 if (rank, i) == (0, 1) else 120.0).findings)

    for i in range(3):
        _try(res, f"step{i}", lambda i=i: step(i))
    return res


def failing_model(rank: int) -> dict:
    """A model whose forward raises on rank 1 only, under the distributed training loop."""
    from inspector.distributed import train_and_check

    class Fails(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if dist.get_rank() == 1:
                raise ValueError("shapes (2, 4) and (3, 3) do not match")
            return super().forward(x)

    res: dict = {}
    _try(res, "error", lambda: train_and_check(Fails(4, 2), lambda b: torch.ones(b, 4),
                                               lambda out, x: out.sum(), 1, None, timeout=1.0))
    return res


def world2_checks(rank: int, world: int) -> dict:
    """Every check above on the 2-rank world, those that break step last."""
    results: dict = {}
    _try(results, "mesh_1x2", lambda: fsdp_tp(1, 2))
    _try(results, "ddp_bn", lambda: ddp_batchnorm(rank))
    _try(results, "nonfinite", lambda: nonfinite(rank))
    _try(results, "far_off", lambda: far_off(rank))
    _try(results, "hash", lambda: hash_edits(rank))
    _try(results, "report", lambda: report_on_fsdp(rank))
    _try(results, "capture", lambda: tp_capture(rank, world))
    _try(results, "skipped", lambda: skipped_call(rank))
    _try(results, "failing", lambda: failing_model(rank))
    return results


def mesh_worker(rank: int, world: int, port: int, out: str) -> None:
    """The 4-rank world: FSDP2 + tensor parallelism on a 2 x 2 mesh."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    init(rank, world, port)
    results: dict = {"rank": rank}
    try:
        _try(results, "mesh_2x2", lambda: fsdp_tp(2, 2))
    finally:
        leave()
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(results, default=str), encoding="utf-8")
