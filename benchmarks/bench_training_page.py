"""The Training page on a long run: open a 10,000-step × 1,000-module run file, rerun, follow a new step.

Target: the page opens (read, bin, draw) in at most 3 s, a step picked redraws it in at most
0.5 s, and no chart sent to the browser exceeds 1 MB. ``--synthetic`` opens the file
:func:`inspector.watching.synthetic_run` writes (an explosion and its finding at three quarters of
the run, parameter norms, a learning rate; complete, so no step is added) instead.
Beside it, what the tools people use today draw for the same run: one line chart
per module (``wandb.watch`` / TensorBoard scalars, here built with plotly and serialised
as the server would send them), timed in the same process.

Run: ``.venv/bin/python benchmarks/bench_training_page.py [--steps 10000] [--modules 1000]``

``--long`` measures a long run instead, one batch per step as the watch writes it (default 300,000
steps × 100 modules): reading it whole, then following it as the Training page does (a
:class:`~inspector.watching.LiveRun` read after each burst of appended steps, with the page's
loss line and heatmap grid), each in a fresh process, with its peak RSS. Target: under 1 GiB.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import plotly.graph_objects as go  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

import ui.training as ui_training  # noqa: E402
from inspector.watching import RunMeta, RunWriter, StepRecord, synthetic_run  # noqa: E402

OPEN_S, STEP_S, CHART_BYTES = 3.0, 0.5, 1_000_000
LONG_RSS = 1 << 30  # a followed 300k-step run stays under 1 GiB of server memory


def _write_long(path: Path, steps: int, modules: int, start: int = 0, close: bool = True) -> None:
    """``steps`` steps from ``start``, one record batch each (as the watch writes), appended to ``path``
    (made with its header when ``start`` is 0)."""
    from inspector.runfiles import END_OF_STREAM, META_KEY
    from inspector.runfiles.columns import file_schema, record_batch

    names = tuple(f"model.layers.{i // 10}.block{i % 10}" for i in range(modules))
    meta = RunMeta(model="bench", world_size=1, every=1, modules=names,
                   parameters=tuple(f"{n}.weight" for n in names), parameter_modules=tuple(range(modules)))
    rng = np.random.default_rng(start)
    with open(path, "wb" if start == 0 else "ab") as f:
        if start == 0:
            f.write(file_schema().with_metadata({META_KEY: meta.to_json().encode()}).serialize())
        for first in range(start, start + steps, 1000):
            n = min(1000, start + steps - first)
            norms = (1 + 0.1 * rng.standard_normal((n, modules))).astype(np.float32)
            batch = record_batch([
                StepRecord(step=first + i, rank=0, time=float(first + i), loss=1.0 / (1 + (first + i) / 1000),
                           grad_norm=float(np.sqrt((norms[i] ** 2).sum())), lr=[1e-3],
                           module_grad_norm=norms[i], module_nonfinite=np.zeros(modules, np.int32),
                           param_grad_norm=norms[i])
                for i in range(n)])
            for i in range(n):  # one batch per step
                f.write(batch.slice(i, 1).serialize())
        if close:
            f.write(END_OF_STREAM)


def _long_child(mode: str, path: str, steps: int, modules: int, bursts: int, burst: int) -> None:
    """In a fresh process: read ``path`` whole (``read``) or follow it as it grows (``follow``); print
    one line of JSON with the seconds and the peak RSS."""
    import json
    import resource

    from inspector.figures import run_norm_grid
    from inspector.watching import LiveRun, main_steps, read_run

    def rss() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    base = rss()
    t = time.perf_counter()
    if mode == "read":
        run = read_run(path)
        main_steps(run)
        run_norm_grid(run, "grad_norm", 0)
        print(json.dumps({"seconds": time.perf_counter() - t, "peak": rss(), "base": base,
                          "rows": len(run.steps)}))
        return
    live = LiveRun(path)

    def page() -> int:  # what one rerun of the page reads; like the page, it keeps no run between reruns
        run = live.read()
        main_steps(run)
        run_norm_grid(run, "grad_norm", 0)
        return len(run.steps)

    page()
    first = time.perf_counter() - t
    refresh = []
    for b in range(bursts):  # a step every 0.1 s, read every 2 s: `burst` steps per read
        _write_long(Path(path), burst, modules, start=steps + b * burst, close=False)
        t = time.perf_counter()
        rows = page()
        refresh.append(time.perf_counter() - t)
    print(json.dumps({"seconds": first, "refresh": statistics.median(refresh), "worst": max(refresh),
                      "peak": rss(), "base": base, "rows": rows}))


def long_run(steps: int, modules: int, bursts: int, burst: int) -> bool:
    """Read and follow a long run, each in a fresh process; print the figures; whether both stay under
    ``LONG_RSS``."""
    import json
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "long.inspect"
        t = time.perf_counter()
        _write_long(path, steps, modules)
        size = path.stat().st_size
        print(f"run file: {steps:,} steps × {modules:,} modules, one batch per step, "
              f"{size / 2**20:,.0f} MiB, written in {time.perf_counter() - t:.0f} s")
        out = {}
        for mode in ("read", "follow"):
            if mode == "follow":  # the run still being written: no end-of-stream marker
                with open(path, "r+b") as f:
                    f.truncate(size - 8)
            cmd = [sys.executable, __file__, "--long-child", mode, str(path), str(steps), str(modules),
                   str(bursts), str(burst)]
            out[mode] = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True)
                                   .stdout.strip().splitlines()[-1])
    read, follow = out["read"], out["follow"]
    print(f"{'what':58} {'seconds':>8} {'peak RSS MiB':>13} {'(imports)':>10}")
    print(f"{'read whole, loss line and heatmap grid':58} {read['seconds']:8.1f} "
          f"{read['peak'] / 2**20:13.0f} {read['base'] / 2**20:10.0f}")
    print(f"{'follow: first read':58} {follow['seconds']:8.1f}")
    print(f"{f'follow: {bursts} reads after {burst} new steps each (median, worst)':58} "
          f"{follow['refresh']:8.2f} {follow['peak'] / 2**20:13.0f} {follow['base'] / 2**20:10.0f}   "
          f"(worst {follow['worst']:.2f} s; {follow['rows']:,} steps at the end)")
    ok = read["peak"] < LONG_RSS and follow["peak"] < LONG_RSS
    print("verdict:", "under 1 GiB" if ok else "OVER 1 GiB")
    return ok


def _records(steps: range, norms: np.ndarray) -> list[StepRecord]:
    return [
        StepRecord(
            step=s,
            rank=0,
            time=float(s),
            loss=1.0 / (1 + s / 1000),
            grad_norm=float(np.sqrt((norms[s] ** 2).sum())),
            module_grad_norm=norms[s],
            module_nonfinite=np.zeros(norms.shape[1], np.int32),
            param_grad_norm=norms[s],
        )
        for s in steps
    ]


def _write(path: Path, steps: int, modules: int) -> tuple[RunWriter, float]:
    rng = np.random.default_rng(0)
    norms = (
        np.exp(rng.normal(0, 1, modules)) * (1 + 0.1 * rng.standard_normal((steps + 1, modules)))
    ).astype(np.float32)
    names = tuple(f"model.layers.{i // 10}.block{i % 10}" for i in range(modules))
    meta = RunMeta(
        model="bench",
        world_size=1,
        every=1,
        modules=names,
        parameters=tuple(f"{n}.weight" for n in names),
        parameter_modules=tuple(range(modules)),
    )
    writer = RunWriter(path, meta)
    t = time.perf_counter()
    for start in range(0, steps, 500):
        writer.write(_records(range(start, min(start + 500, steps)), norms))
    return writer, time.perf_counter() - t


def _chart_bytes(at: AppTest) -> list[int]:
    return [len(el.proto.spec.encode()) for el in at.get("plotly_chart")]


def _timed(at: AppTest) -> float:
    t = time.perf_counter()
    at.run()
    if at.exception or at.error:
        raise SystemExit(f"the page failed: {[e.value for e in [*at.exception, *at.error]]}")
    return time.perf_counter() - t


def _step_changes(at: AppTest, steps: int, repeats: int) -> float:
    """Median seconds to redraw the page after a person picks another step (follow the latest: off)."""
    at.checkbox(key="train_latest").uncheck()
    _timed(at)
    times = []
    for i in range(repeats):
        at.number_input(key="train_step").set_value(steps * (i + 1) // (repeats + 2))
        times.append(_timed(at))
    return statistics.median(times)


def _per_layer_charts(steps: int, modules: int, limit: int) -> tuple[float, int]:
    """Seconds and bytes for one line chart per module (``limit`` of them built, scaled to all)."""
    rng = np.random.default_rng(1)
    x = np.arange(steps)
    t = time.perf_counter()
    size = 0
    for _ in range(limit):
        fig = go.Figure(go.Scatter(x=x, y=rng.random(steps).astype(np.float32), mode="lines"))
        size += len(fig.to_json())
    return (time.perf_counter() - t) * modules / limit, size * modules // limit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--modules", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--synthetic", action="store_true",
                        help="open a complete run written by inspector.watching.synthetic_run")
    parser.add_argument("--per-layer-sample", type=int, default=100,
                        help="per-layer charts actually built (the time is scaled to every module)")
    parser.add_argument("--long", action="store_true", help="read and follow a long run instead")
    parser.add_argument("--long-steps", type=int, default=300_000)
    parser.add_argument("--long-modules", type=int, default=100)
    parser.add_argument("--bursts", type=int, default=60, help="reads while following (2 minutes at 2 s)")
    parser.add_argument("--burst", type=int, default=20, help="steps appended before each read")
    parser.add_argument("--long-child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.long_child:
        mode, path, *numbers = args.long_child
        _long_child(mode, path, *map(int, numbers))
        return 0
    if args.long:
        return 0 if long_run(args.long_steps, args.long_modules, args.bursts, args.burst) else 1
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.inspect"
        os.environ["INSPECTOR_RUNS"] = tmp  # the page opens run files only under a runs folder
        t = time.perf_counter()
        writer = None
        if args.synthetic:
            synthetic_run(path, steps=args.steps, modules=args.modules)
        else:
            writer, _ = _write(path, args.steps, args.modules)
        write_s = time.perf_counter() - t
        size = path.stat().st_size
        print(
            f"run file: {args.steps:,} steps × {args.modules:,} modules, {size / 2**20:.1f} MiB "
            f"({size / (args.steps * args.modules):.1f} bytes per module per step), "
            f"written in {write_s:.2f} s\n"
        )
        opens = []
        for _ in range(args.repeats):  # a fresh session and an empty server cache each time: the first open
            ui_training.clear_cache()
            at = AppTest.from_file(str(ROOT / "pages" / "8_Training.py"), default_timeout=600)
            at.query_params["run"] = str(path)
            opens.append(_timed(at))
        warm = statistics.median(_timed(at) for _ in range(args.repeats))
        grown, last = float("nan"), "-"
        if writer is not None:
            ones = np.ones((args.steps + 1, args.modules), np.float32)
            writer.write(_records(range(args.steps, args.steps + 1), ones))
            grown = _timed(at)
            last = next(m.value for m in at.metric if m.label == "Last step")
            writer.close()
        charts = _chart_bytes(at)
        picked = _step_changes(at, args.steps, args.repeats)
        per_layer_s, per_layer_bytes = _per_layer_charts(args.steps, args.modules, args.per_layer_sample)
    first = statistics.median(opens)
    print(f"{'what':44} {'seconds':>8} {'/target':>8} {'chart MB':>9}")
    print(
        f"{'Training page, first open (median)':44} {first:8.2f} {first / OPEN_S:8.2f} "
        f"{max(charts) / 1e6:9.2f}   (each open: {', '.join(f'{o:.2f}' for o in opens)}; "
        "the first also imports and loads the sidebar model)"
    )
    print(f"{'Training page, rerun, file unchanged':44} {warm:8.2f} {'':>8}")
    print(f"{'Training page, rerun after a step (to ' + last + ')':44} {grown:8.2f} {grown / OPEN_S:8.2f}")
    print(f"{'Training page, a step picked (median)':44} {picked:8.2f} {picked / STEP_S:8.2f}")
    print(
        f"{'one line chart per module (built, serialised)':44} {per_layer_s:8.2f} "
        f"{per_layer_s / OPEN_S:8.2f} "
        f"{per_layer_bytes / 1e6:9.1f}"
    )
    print(f"\nper-layer charts / Training page: {per_layer_s / first:.1f}x the time, "
          f"{per_layer_bytes / sum(charts):.0f}x the bytes sent ({len(charts)} charts on the page)")
    ok = first <= OPEN_S and picked <= STEP_S and max(charts) <= CHART_BYTES
    print("verdict:", "meets the targets" if ok else "MISSES a target")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
