"""What the watch's check-ins cost per step, world size 2 (gloo, CPU, one torch thread).

Under ``inspector.watch`` every rank checks in through the process group's store before each training
forward pass and before each step (two check-ins per step; docs/distributed.md). Each rank times a DDP
training step (forward, backward, ``optimizer.step()``, ``zero_grad``) inside one watch, interleaved:
one step with the check-ins, one without (the same watch with its check-ins switched off for that
step), the order flipped every round. Rank 0 prints the medians, the median of the paired differences
and the paired ratio. Run: ``python benchmarks/bench_checkin.py [--repeats N] [--width W]``.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _timing import rounds  # noqa: E402


def _worker(rank: int, world: int, port: int, repeats: int, width: int, out: str) -> None:
    from inspector import watch
    from inspector.distributed import end_group

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        layers = [torch.nn.Linear(width, width) for _ in range(8)]
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(32, width, generator=torch.Generator().manual_seed(rank))

        def step() -> None:
            model(x).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()

        with watch(model, opt, Path(out) / "bench.inspect") as w:
            meeting = w.ranks.meeting
            inside: list[float] = []  # seconds in the check-ins of each step with them
            check_in = meeting.check_in

            def timed(*args: object) -> None:
                began = time.perf_counter()
                try:
                    check_in(*args)
                finally:
                    inside[-1] += time.perf_counter() - began

            meeting.check_in = timed

            def on() -> None:
                w.ranks.meeting = meeting
                inside.append(0.0)
                step()

            def off() -> None:
                w.ranks.meeting = None
                step()

            times = rounds({"check-ins": on, "none": off}, repeats, order="flip")
            w.ranks.meeting = meeting
        from inspector.watching.ranks import Meeting

        meeting = Meeting(None, rank, world, 60.0, {})  # check-ins alone, the ranks in lockstep
        for i in range(50):
            meeting.check_in("forward", i, i, True)
        began = time.perf_counter()
        for i in range(1000):
            meeting.check_in("forward", i, i, True)
        alone = (time.perf_counter() - began) / 1000
        if rank == 0:
            with_, without = times["check-ins"], times["none"]
            diff = statistics.median(a - b for a, b in zip(with_, without, strict=True))
            ratio = statistics.median(a / b for a, b in zip(with_, without, strict=True))
            print(f"DDP step, 8 x Linear({width}, {width}), batch 32, {repeats} paired rounds, world 2 "
                  "(gloo, CPU)")
            print(f"  step without check-ins  {statistics.median(without) * 1e3:8.3f} ms")
            print(f"  step with check-ins     {statistics.median(with_) * 1e3:8.3f} ms")
            print(f"  paired difference       {diff * 1e3:8.3f} ms per step (two check-ins)")
            print(f"  paired ratio            {ratio:8.3f}x")
            print(f"  in the check-ins        {statistics.median(inside) * 1e3:8.3f} ms per step (median; "
                  "waiting for the other rank there is waiting it would do in the first collective)")
            print(f"  one check-in alone      {alone * 1e3:8.3f} ms (1,000 in a row, both ranks in lockstep)")
    finally:
        end_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(_worker, args=(2, port, args.repeats, args.width, out), nprocs=2,
                           start_method="spawn")


if __name__ == "__main__":
    main()
