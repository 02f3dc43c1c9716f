"""The one-process training commands exit promptly, run after run.

Runs ``python -m inspector distributed ... --shard ddp`` and ``watch ... --shard ddp`` (and the
FSDP forms with ``--fsdp``) N times each as a user would, each in a fresh process with a hard
limit, and prints how many exited 0 in time and their wall times. A process-group teardown that
can deadlock shows up here as runs that hit the limit.

    python benchmarks/exit_check.py --runs 100 [--fsdp] [--limit 120]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def one_run(command: str, shard: str, out: Path, limit: float) -> tuple[str, float]:
    argv = [sys.executable, "-m", "inspector", command, "sample_models/fsdp.py:build", "--shard", shard,
            "--steps", "2", "-o", str(out)]
    start = time.perf_counter()
    try:
        done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return "hung", time.perf_counter() - start
    return ("ok" if done.returncode == 0 else f"exit {done.returncode}"), time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--limit", type=float, default=120.0, help="seconds one run may take")
    parser.add_argument("--fsdp", action="store_true", help="also the --shard fsdp forms")
    args = parser.parse_args()
    shards = ("ddp", "fsdp") if args.fsdp else ("ddp",)
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for command in ("distributed", "watch"):
            for shard in shards:
                outcomes, seconds = [], []
                for i in range(args.runs):
                    outcome, wall = one_run(command, shard, Path(tmp) / f"{command}-{shard}-{i}", args.limit)
                    outcomes.append(outcome)
                    seconds.append(wall)
                ok = outcomes.count("ok")
                failed += args.runs - ok
                print(f"{command} --shard {shard}: {ok} of {args.runs} exited 0 in time "
                      f"(hung: {outcomes.count('hung')}); wall median {statistics.median(seconds):.2f} s, "
                      f"max {max(seconds):.2f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
