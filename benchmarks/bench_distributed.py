"""What ``check_step`` costs next to the training step it watches, world size 2 (gloo, CPU).

For the FSDP2 sample (``sample_models/fsdp.py:build``, 18,282 parameters) and a wider one
(``build_wide``, 8,425,994 parameters), each rank times, interleaved and as medians:

- ``train step``: forward, backward and ``optimizer.step()`` of the FSDP2 model (SGD), the
  thing being watched;
- ``clip_grad_norm_``: torch's global gradient norm over the same DTensor gradients, what
  people call every step today (one collective);
- ``check_step``: the full check (norms, NaN/Inf counts, hashes of every local piece, memory,
  one ``all_gather`` of the numbers), writing nothing;
- ``check_step, no hashes``: the same with value hashing off (``collect(..., hashes=False)``),
  to show what hashing costs.

Rank 0 prints milliseconds and the ratios check / train step and check / clip_grad_norm_.
Target: the check under 25% of the training step on the wide model. Where CUDA is available,
``--device cuda`` runs world size 1 on NCCL. Run: ``python benchmarks/bench_distributed.py
[--repeats N] [--world-size 2] [--device cpu|cuda]``.
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _time(fns: dict, repeats: int, sync) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            t = time.perf_counter()
            fn()
            sync()
            times[name].append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _bench(factory: str, device: torch.device, repeats: int, batch_size: int) -> dict[str, float]:
    from torch.distributed.fsdp import fully_shard

    import sample_models.fsdp as sample
    from inspector.distributed import check_step
    from inspector.distributed.check import collect
    from inspector.distributed.train import fsdp_units

    with torch.device(device):
        model = getattr(sample, factory)()
    for unit in fsdp_units(model):
        fully_shard(unit)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = sample.example_inputs(batch_size).to(device)

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=False)
        sample.loss(model(x), x).backward()
        optimizer.step()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()

    train_step()  # gradients exist for the checks
    fns = {
        "train step": train_step,
        "clip_grad_norm_": lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf),
        "check_step": lambda: check_step(model, 0, path=None),
        "check_step, no hashes": lambda: collect(model, 0, hashes=False),
    }
    return _time(fns, repeats, sync) | {"parameters": sum(p.numel() for p in model.parameters())}


def _worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for factory, batch in (("build", 32), ("build_wide", 32)):
            result = _bench(factory, device, args.repeats, batch)
            if rank == 0:
                step, check = result["train step"], result["check_step"]
                print(f"\n{factory} ({result['parameters']:,} parameters, batch {batch} per rank, world {world}, "
                      f"{backend}, {args.repeats} repeats, medians)")
                for name in ("train step", "clip_grad_norm_", "check_step", "check_step, no hashes"):
                    print(f"  {name:24} {result[name] * 1e3:9.3f} ms")
                print(f"  check_step / train step       {check / step:7.3f}x")
                print(f"  check_step / clip_grad_norm_  {check / result['clip_grad_norm_']:7.3f}x")
                print(f"  no-hash check / train step    {result['check_step, no hashes'] / step:7.3f}x")
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--world-size", type=int, default=None)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    world = args.world_size or (1 if args.device == "cuda" else 2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"torch {torch.__version__}; {os.cpu_count()} CPUs")
    mp.spawn(_worker, args=(world, port, args), nprocs=world, join=True)


if __name__ == "__main__":
    main()
