"""What files inside the limits cost a server: run files with one column per learning rate, compared and
reported, and JSON-lines run files of many tiny records.

Each case runs in a fresh process (one torch thread); the figures are the wall time of the call and the
peak resident memory that process reached above its own baseline (the inspector imported and a small
comparison made). The targets: two runs of ``MAX_LRS`` (100,000) learning rates, 2.4 MB each, compare in
at most 2 s and 64 MB + 4x their size; the 63 MB JSON-lines file of minimal records (660,000 lines) is
answered in at most 10 s. Exits 1 when a target is missed.

Run: ``python benchmarks/bench_hostile.py [--lrs 100000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_CHILD = textwrap.dedent('''
    import contextlib, io, json, resource, sys, time
    import torch
    torch.set_num_threads(1)
    from inspector import InspectorError, compare, read_run
    from inspector.__main__ import main
    from inspector.report import watch_report
    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    case, a, b, small_a, small_b = sys.argv[1:6]
    compare(small_a, small_b)  # the baseline: everything a comparison imports, imported
    def call():
        if case == "compare":
            compare(a, b)
        elif case == "compare-cli":
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                main(["compare", a, b])
        elif case == "report":
            watch_report(read_run(a)).to_html()
        elif case == "read":
            read_run(a)
    base = rss()
    t0 = time.perf_counter()
    try:
        call()
        outcome = "ok"
    except InspectorError as exc:
        outcome = "refused: " + str(exc)[:90]
    seconds = time.perf_counter() - t0
    print(json.dumps({"seconds": seconds, "peak": rss() - base, "outcome": outcome}))
''')


def run(case: str, a: Path, b: Path, small: tuple[Path, Path]) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", _CHILD, case, str(a), str(b), *map(str, small)],
                          capture_output=True, text=True, cwd=ROOT, env=env)
    if done.returncode:
        raise SystemExit(f"{case} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def wide_run(path: Path, lrs: int, shift: float = 0.0, steps: int = 3) -> Path:
    import numpy as np

    from inspector.watching import RunMeta, RunWriter, StepRecord

    meta = RunMeta(model="m", world_size=1, every=1, modules=("a",), parameters=("a.w",),
                   parameter_modules=(0,))
    with RunWriter(path, meta) as w:
        for s in range(steps):
            lr = list(np.arange(lrs) * 1e-3 + s + shift)
            w.write([StepRecord(step=s, rank=0, time=0.0, loss=1.0, lr=lr)])
    return path


def minimal_jsonl(path: Path, size: int) -> Path:
    line = '{"format":"inspector-distributed","step":%d,"world_size":1,"ranks":[],"tensors":[],"global":{}}\n'
    with open(path, "w") as fh:
        written, step = 0, 0
        while written < size:
            written += fh.write(line % step)
            step += 1
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lrs", type=int, default=100_000)
    args = parser.parse_args()
    from inspector.runfiles import MAX_JSONL_RECORDS

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        small = (wide_run(root / "sa.inspect", 10), wide_run(root / "sb.inspect", 10))
        a, b = wide_run(root / "a.inspect", args.lrs), wide_run(root / "b.inspect", args.lrs, shift=0.5)
        a20, b20 = wide_run(root / "a20.inspect", 20_000), wide_run(root / "b20.inspect", 20_000, shift=0.5)
        big = minimal_jsonl(root / "big.jsonl", 63_000_000)
        lines = sum(1 for _ in open(big))
        at_budget = root / "budget.jsonl"
        with open(big) as src, open(at_budget, "w") as dst:
            for _, line in zip(range(MAX_JSONL_RECORDS), src, strict=False):
                dst.write(line)
        size = a.stat().st_size + b.stat().st_size
        rows = [
            (f"compare, 2 runs of {args.lrs:,} lrs", f"{size / 1e6:.1f} MB in all",
             run("compare", a, b, small), 2.0, 64 * 2**20 + 4 * size),
            ("compare, 2 runs of 20,000 lrs", "", run("compare", a20, b20, small), None, None),
            (f"`compare A B` printed, {args.lrs:,} lrs", "", run("compare-cli", a, b, small), None, None),
            (f"report (html) of a run of {args.lrs:,} lrs", "", run("report", a, a, small), None, None),
            (f"read_run, JSON lines of {lines:,} records", f"{big.stat().st_size / 1e6:.0f} MB",
             run("read", big, big, small), 10.0, None),
            (f"read_run, JSON lines of {MAX_JSONL_RECORDS:,} records", "the budget",
             run("read", at_budget, at_budget, small), 10.0, None),
        ]
    missed = []
    print(f"{'case':46} {'seconds':>8} {'peak MiB':>9}  outcome")
    for what, note, r, seconds, peak in rows:
        flag = ""
        if seconds is not None and r["seconds"] > seconds:
            flag, missed = f" MISSED {seconds:g} s", [*missed, what]
        if peak is not None and r["peak"] > peak:
            flag, missed = flag + f" MISSED {peak / 2**20:.0f} MiB", [*missed, what]
        print(f"{what:46} {r['seconds']:8.2f} {r['peak'] / 2**20:9.1f}  {r['outcome'][:70]} {note}{flag}")
    limit = (64 * 2**20 + 4 * size) / 2**20
    print(f"\ntargets: compare at most 2 s and {limit:.0f} MiB (64 MB + 4x the files); the 63 MB JSON-lines "
          "file at most 10 s")
    if missed:
        print("missed: " + "; ".join(missed))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
