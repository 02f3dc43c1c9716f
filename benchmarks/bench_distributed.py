"""What ``check_step`` costs next to the training step it watches, world size 2 (gloo, CPU).

For the FSDP2 sample (``sample_models/fsdp.py:build``, 18,282 parameters), a wider one
(``build_wide``, 8,425,994 parameters) and ``many`` (1,000 tensors, 9,870,000 elements, under FSDP2
and under DDP), each rank times, interleaved and as medians:

- ``train step``: forward, backward and ``optimizer.step()`` of the FSDP2 model (SGD), the
  thing being watched;
- ``clip_grad_norm_``: torch's global gradient norm over the same DTensor gradients, what
  people call every step today (one collective);
- ``check_step``: the full check (norms, NaN/Inf counts, hashes of what each call reads, memory,
  one ``all_gather`` of the numbers), writing nothing;
- ``check_step, no hashes``: the same with value hashing off (``collect(..., hashes=False)``),
  to show what hashing costs;
- ``check_step, given norms``: the full check given the local gradient norms the step already
  took (``grad_norms=``, as ``inspector.watch`` passes them), so it does not read the gradients;
- ``watched step``: the training step inside ``inspector.watch(model, optimizer, every=1)`` (its
  per-step numbers, its findings and ``check_step`` every step) and ``every=10``, each against plain
  steps taken in the same rounds (3 plain steps, then a watch block of ``--block`` timed steps after an
  untimed first one, repeated).

Rank 0 prints milliseconds (wall clock and this process's CPU time) and the ratios check / train
step and check / clip_grad_norm_.
Target: the check under 5% of the training step on ``many``. Where CUDA is available,
``--device cuda`` runs world size 1 on NCCL. Run: ``python benchmarks/bench_distributed.py
[--repeats N] [--world-size 2] [--device cpu|cuda] [--only many] [--wrap fsdp|ddp] [--block N]``
(``--block``: timed steps per watched round, 3 by default; more steadies the paired figures).
"""

from __future__ import annotations

import argparse
import math
import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _timing import interleaved  # noqa: E402


class Many(torch.nn.Module):
    """1,000 tensors, 9,870,000 elements: 500 Linear(140, 140) (19,600 + 140 each) in 10 FSDP units of 50."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.units = torch.nn.ModuleList(torch.nn.Sequential(*[torch.nn.Linear(140, 140) for _ in range(50)])
                                         for _ in range(10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for unit in self.units:
            x = torch.tanh(unit(x))
        return x

    def fsdp_units(self) -> list[torch.nn.Module]:
        return list(self.units)


def _bench(
    factory: str, device: torch.device, repeats: int, batch_size: int, wrap: str = "fsdp", block: int = 3
) -> dict[str, float]:
    from torch.distributed.fsdp import fully_shard

    import sample_models.fsdp as sample
    from inspector.distributed import check_step
    from inspector.distributed.check import collect
    from inspector.distributed.train import fsdp_units

    with torch.device(device):
        model = Many() if factory == "many" else getattr(sample, factory)()
    if wrap == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    else:
        for unit in fsdp_units(model):
            fully_shard(unit)
        fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(batch_size, 140, generator=g).to(device) if factory == "many" else \
        sample.example_inputs(batch_size).to(device)

    def train_step(clip: Any = None) -> None:
        optimizer.zero_grad(set_to_none=False)
        out = model(x)
        (out.pow(2).mean() if factory == "many" else sample.loss(out, x)).backward()
        if clip is not None:
            clip()
        optimizer.step()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()

    train_step()  # gradients exist for the checks
    inner = model.module if wrap == "ddp" else model
    names = tuple(n for n, _ in inner.named_parameters())
    local = [
        p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad for _, p in inner.named_parameters()
    ]
    norms = torch.stack(torch._foreach_norm(local)).double()
    fns = {
        "train step": train_step,
        "clip_grad_norm_": lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf),
        "check_step": lambda: check_step(model, 0, path=None),
        "check_step, no hashes": lambda: collect(model, 0, hashes=False),
        "check_step, given norms": lambda: check_step(model, 0, path=None, grad_norms=(names, norms)),
    }
    wall = interleaved(fns, repeats, sync)
    cpu = _cpu_medians(fns, repeats, sync)
    for every in (1, 10):
        paired = _watched(model, optimizer, train_step, repeats, sync, every, block=block)
        cpu[f"paired plain {every}"], cpu[f"watched {every}"] = paired
        paired = _watched(model, optimizer, train_step, repeats, sync, every, clip=True, block=block)
        cpu[f"paired plain+clip {every}"], cpu[f"watched+w.clip {every}"] = paired
    return (
        wall
        | {f"cpu {k}": v for k, v in cpu.items()}
        | {"parameters": sum(p.numel() for p in model.parameters())}
    )


def _watched(model, optimizer, train_step, repeats: int, sync, every: int = 1,
             clip: bool = False, block: int = 3) -> tuple[float, float]:
    """CPU seconds per step, median over rounds, of the plain training step and of the same step inside
    ``inspector.watch(every=every)``, paired: each round runs as many plain steps as it then times inside
    a watch, after a first one (which builds what the watch keeps, not timed): ``block`` steps or more,
    whole multiples of ``every`` (one check step in each ``every``), so the mean of a round is the cost
    per step at that ``every``. ``clip``:
    the plain steps clip with torch's ``clip_grad_norm_``, the watched ones with ``w.clip_grad_norm_``."""
    import statistics
    import tempfile
    import time

    from inspector import watch

    steps = every * max(1, -(-block // every))  # whole blocks of `every`: one check step in each
    plain: list[float] = []
    watched: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(repeats):
            torch_clip = (lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)) if clip else None
            t = time.process_time()
            for _ in range(steps):
                sync()
                train_step(torch_clip)
            plain.append((time.process_time() - t) / steps)
            with watch(model, optimizer, Path(tmp) / f"run{r}.inspect", every=every) as w:
                watch_clip = (lambda: w.clip_grad_norm_(1.0)) if clip else None
                sync()
                train_step(watch_clip)
                t = time.process_time()
                for _ in range(steps):
                    sync()
                    train_step(watch_clip)
                w.flush()  # the rows the run file holds back (rank 0) are written, and timed
                watched.append((time.process_time() - t) / steps)
    return statistics.median(plain), statistics.median(watched)


def _cpu_medians(fns: dict, repeats: int, sync) -> dict[str, float]:
    """Median CPU seconds of this process per call (interleaved): the cost without the waits a
    shared machine adds to the wall clock (a rank descheduled while the other waits for it)."""
    import statistics
    import time

    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            sync()
            t = time.process_time()
            fn()
            times[name].append(time.process_time() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def _worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    backend = "nccl" if args.device == "cuda" else "gloo"
    if args.device == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for factory, batch, wrap in (("build", 32, "fsdp"), ("build_wide", 32, "fsdp"), ("many", 32, "fsdp"),
                                     ("many", 32, "ddp")):
            if (args.only and factory not in args.only) or (args.wrap and wrap != args.wrap):
                continue
            result = _bench(factory, device, args.repeats, batch, wrap, args.block)
            if rank == 0:
                step, check = result["train step"], result["check_step"]
                print(
                    f"\n{factory} {wrap} ({result['parameters']:,} parameters, batch {batch} per rank, "
                    f"world {world}, {backend}, {args.repeats} repeats, medians)"
                )
                for name in ("train step", "clip_grad_norm_", "check_step", "check_step, no hashes",
                     "check_step, given norms"):
                    print(
                        f"  {name:24} {result[name] * 1e3:9.3f} ms wall  "
                        f"{result['cpu ' + name] * 1e3:9.3f} ms CPU"
                    )
                print(f"  check_step / train step       {check / step:7.3f}x")
                print(f"  check_step / clip_grad_norm_  {check / result['clip_grad_norm_']:7.3f}x")
                print(f"  no-hash check / train step    {result['check_step, no hashes'] / step:7.3f}x")
                cpu_step, cpu_check = result["cpu train step"], result["cpu check_step"]
                print(f"  by CPU time: check_step / train step {cpu_check / cpu_step:7.3f}x, "
                      f"clip_grad_norm_ / train step {result['cpu clip_grad_norm_'] / cpu_step:7.3f}x")
                given = result["cpu check_step, given norms"]
                print(f"  by CPU time: check_step given norms / train step {given / cpu_step:7.3f}x "
                      f"({given * 1e3:.3f} ms)")
                for every in (1, 10):
                    plain, watched = result[f"cpu paired plain {every}"], result[f"cpu watched {every}"]
                    print(f"  by CPU time, paired: watched step (every={every}) {watched * 1e3:.3f} ms "
                          f"against {plain * 1e3:.3f} ms, {watched / plain:.3f}x (goal <= 1.05x at every=1)")
                clip = result["cpu clip_grad_norm_"]
                for every, goal in ((1, 1.0), (10, 0.5)):
                    plain = result[f"cpu paired plain+clip {every}"]
                    extra = result[f"cpu watched+w.clip {every}"] - plain
                    print(f"  clipping loops, every={every}: the watch (w.clip_grad_norm_) adds "
                          f"{extra * 1e3:.3f} ms to a step that clips ({plain * 1e3:.3f} ms): "
                          f"{extra / clip:.2f}x the clip's {clip * 1e3:.3f} ms (goal <= {goal}x)")
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--world-size", type=int, default=None)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--only", nargs="*", default=None, help="factories to run (build, build_wide, many)")
    parser.add_argument("--wrap", choices=("fsdp", "ddp"), default=None, help="one wrapper only")
    parser.add_argument("--block", type=int, default=3,
                        help="timed steps per watched round, at least (whole multiples of every)")
    args = parser.parse_args()
    world = args.world_size or (1 if args.device == "cuda" else 2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    print(f"torch {torch.__version__}; {os.cpu_count()} CPUs")
    mp.spawn(_worker, args=(world, port, args), nprocs=world, join=True)


if __name__ == "__main__":
    main()
