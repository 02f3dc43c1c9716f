"""One rank of the world-size-2 gloo run that tests/test_distributed.py starts once.

Each rank runs the ``distributed`` command as torchrun would, then a set of checks on one
FSDP2 model and one tensor-parallel model, and writes what it saw to ``rank<N>.json``;
the tests assert on those files. Planted faults: a NaN in rank 1's gradient piece, a
perturbed replicated buffer on rank 1, a perturbed ``Replicate()`` DTensor on rank 1.
"""

from __future__ import annotations

import json
import math
import os
import time
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


def _fsdp_model():
    from torch.distributed.fsdp import fully_shard

    from inspector.distributed import fsdp_units
    from sample_models.fsdp import build

    model = build()
    for unit in fsdp_units(model):
        fully_shard(unit)
    fully_shard(model)
    return model


def _backward(model) -> None:
    from sample_models.fsdp import example_inputs, loss

    x = example_inputs(4)
    loss(model(x), x).backward()


def _cli(rank: int, world: int, port: int, out: Path) -> dict:
    from inspector.__main__ import main

    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    rc = main(["distributed", "sample_models/fsdp.py:build", "--shard", "fsdp", "--steps", "3",
               "-o", str(out / "run.jsonl")])
    return {"rc": rc, "initialised_after": dist.is_initialized()}


def _fsdp_checks(rank: int, out: Path) -> dict:
    import inspector
    from inspector.distributed import check_step
    from inspector.offsets import gradient_norms, gradient_report

    res: dict = {}
    model = _fsdp_model()
    _backward(model)
    report = gradient_report(model)
    res["report_total"] = report.total_norm
    res["report_rows"] = report.by_parameter[
        ["name", "norm", "local_norm", "state", "placements"]
    ].values.tolist()
    res["module_names"] = report.by_module["name"].tolist()[:3]
    res["module_norms"] = report.by_module["norm"].tolist()[:3]
    res["local_norms_direct"] = {n: float(torch.linalg.vector_norm(p.grad.to_local()))
                                 for n, p in model.named_parameters()}
    res["check_total"] = check_step(model, 0, path=None).record["global"]["grad_norm"]
    named = dict(model.named_parameters())
    explicit = gradient_report(model, grads={n: p.grad for n, p in named.items()})
    res["explicit_total"] = explicit.total_norm
    res["explicit_local"] = explicit.by_parameter["local_norm"].tolist()
    # only fc1's gradients given (as DTensors, as torch.autograd.grad returns them)
    fc1 = {n: p.grad for n, p in named.items() if ".fc1." in n}
    res["fc1_total"] = gradient_report(model, grads=fc1).total_norm
    res["fc1_direct"] = math.sqrt(
        sum(float(torch.linalg.vector_norm(g.full_tensor())) ** 2 for g in fc1.values())
    )
    _try(
        res,
        "explicit_local_piece",
        lambda: gradient_report(model, grads={"stem.weight": named["stem.weight"].grad.to_local()}),
    )
    # per parameter then per module: two passes, every rank makes both
    res["norms_twice"] = [gradient_norms(model)["norm"].tolist()[:2],
                          gradient_norms(model, by="module")["norm"].tolist()[:1]]
    res["clip_total"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf))

    table = inspector.offset_map(model)
    res["offset_columns"] = list(table.columns)
    res["offsets"] = table[["name", "start", "end", "numel", "local_start", "local_end", "local_numel",
                            "piece_start", "piece_end", "placements", "mesh"]].values.tolist()
    res["local_shapes"] = {n: list(p.to_local().shape) for n, p in model.named_parameters()}
    _try(res, "aliases", lambda: [g.names for g in inspector.alias_groups(model)])
    _try(res, "placement", lambda: inspector.placement_table(model)[
        ["name", "placements", "local_bytes", "bytes_per_rank"]].astype(str).values.tolist())

    def per_rank():
        from inspector.distributed import mesh_dims, rank_bytes

        return {"ranks": rank_bytes(inspector.placement_table(model)).values.tolist(),
                "mesh_dims": mesh_dims(model).values.tolist()}
    _try(res, "rank_bytes", per_rank)

    def capture():
        from sample_models.fsdp import example_inputs

        caps = inspector.capture_activations(model, example_inputs(2))
        return {"outputs": sorted(caps.outputs), "still_dtensor": all(
            type(p).__name__ == "DTensor" for p in model.parameters())}
    _try(res, "capture", capture)

    def report_sections():
        from inspector import LoadedModel
        from sample_models.fsdp import example_inputs, loss

        loaded = LoadedModel(
            model, "fsdp", "sample_models/fsdp.py:build", inputs_fn=example_inputs, loss_fn=loss
        )
        rep = inspector.build_report(loaded, conversions=[], attribution_steps=4)
        return {s.id: [s.status, s.note] for s in rep.sections}
    _try(res, "report", report_sections)

    # planted NaN: rank 1's piece of blocks.0.fc1.weight
    model.zero_grad(set_to_none=True)
    _backward(model)
    if rank == 1:
        with torch.no_grad():
            model.blocks[0].fc1.weight.grad.to_local()[0, 0] = float("nan")
    check = check_step(model, 1, path=str(out / "planted.jsonl"))
    res["nan_findings"] = [f.to_dict() for f in check.findings]
    res["nan_report"] = (
        gradient_report(model).by_parameter[["name", "state", "nonfinite_ranks"]].values.tolist()
    )

    # planted drift: rank 1 perturbs the replicated buffer ``scale``
    model.zero_grad(set_to_none=True)
    _backward(model)
    if rank == 1:
        with torch.no_grad():
            model.scale[3] += 1e-6
    check = check_step(model, 2, path=str(out / "planted.jsonl"))
    res["drift_findings"] = [f.to_dict() for f in check.findings]
    with torch.no_grad():  # saved weights = built weights + 1, so a load is told from a fresh build
        for p in model.parameters():
            p.add_(1.0)
    _try(res, "dcp", lambda: _save_dcp(model, out / "dcp"))
    return res


def _save_dcp(model, folder: Path) -> str:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    dcp.save(get_model_state_dict(model), checkpoint_id=str(folder))
    return str(folder)


class _TP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 6)      # ColwiseParallel: weight Shard(0) (3 rows each), bias Shard(0)
        self.down = nn.Linear(6, 4)    # RowwiseParallel: weight Shard(1) (3 columns each), bias Replicate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _tp_checks(rank: int, world: int) -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    import inspector
    from inspector.distributed import check_step
    from inspector.offsets import gradient_report

    res: dict = {}
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    model = parallelize_module(_TP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    model(x).pow(2).sum().backward()
    res["report_total"] = gradient_report(model).total_norm
    res["clip_total"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf))
    table = inspector.offset_map(model)
    res["offsets"] = table[
        ["name", "numel", "local_numel", "piece_start", "piece_end", "placements"]
    ].values.tolist()
    if rank == 1:
        with torch.no_grad():
            model.down.bias.to_local()[0] += 1.0
    res["drift_findings"] = [f.to_dict() for f in check_step(model, 0, path=None).findings]
    return res


def _strided_checks(rank: int, world: int) -> dict:
    """A (8, 2) parameter placed as FSDP2 places one over tensor parallelism:
    _StridedShard(0, split_factor=2); each rank holds 4 rows (rank 0 rows 0-1 and 4-5), 8 elements,
    32 bytes, in two blocks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor
    from torch.distributed.tensor.placement_types import _StridedShard

    import inspector
    from inspector.distributed import rank_bytes
    from inspector.offsets import gradient_report

    mesh = init_device_mesh("cpu", (world,))
    model = nn.Module()
    full = torch.arange(16, dtype=torch.float32).reshape(8, 2)
    model.w = nn.Parameter(distribute_tensor(full, mesh, [_StridedShard(0, split_factor=2)]))
    model.w.grad = distribute_tensor(full, mesh, [_StridedShard(0, split_factor=2)])
    table = inspector.offset_map(model)
    placement = inspector.placement_table(model)
    return {
        "grad_total": gradient_report(model).total_norm,
        "local_rows": model.w.to_local()[:, 0].div(2).int().tolist(),
        "offsets": table[["name", "numel", "local_numel", "piece_start", "piece_end"]].values.tolist(),
        "bytes_per_rank": {str(k): v for k, v in placement["bytes_per_rank"].iloc[0].items()},
        "local_bytes": int(placement["local_bytes"].iloc[0]),
        "sharded": bool(placement["sharded"].iloc[0]),
        "rank_bytes": rank_bytes(placement).values.tolist(),
    }


def worker(rank: int, world: int, port: int, out: str) -> None:
    out_dir = Path(out)
    torch.manual_seed(0)
    results: dict = {"rank": rank}
    start = time.perf_counter()
    results["cli"] = _cli(rank, world, port, out_dir)
    seconds = {"cli": time.perf_counter() - start}
    init(rank, world, port + 1)
    try:
        results["fsdp"] = _fsdp_checks(rank, out_dir)
        seconds["fsdp"] = time.perf_counter() - start - sum(seconds.values())
        results["tp"] = _tp_checks(rank, world)
        seconds["tp"] = time.perf_counter() - start - sum(seconds.values())
        _try(results, "strided", lambda: _strided_checks(rank, world))
        from distributed_checks import world2_checks  # last: some of them leave the ranks out of step

        results["checks"] = world2_checks(rank, world)
        seconds["checks"] = time.perf_counter() - start - sum(seconds.values())
    finally:
        leave()
    results["seconds"] = seconds
    (out_dir / f"rank{rank}.json").write_text(json.dumps(results, default=str), encoding="utf-8")
