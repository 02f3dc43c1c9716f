"""The Training page on a long run: open a 10,000-step × 1,000-module run file, rerun, follow a new step.

Target: the page opens (read, bin, draw) in at most 3 s, a step picked (by hand, or the verdict's
"Go to step") redraws it in at most 0.5 s, and no chart sent to the browser exceeds 1 MB; each
measure is timed beside a rerun of Streamlit's trivial page (a title and a line), and the targets
hold for the difference, so the machine's load is factored out. A step opened by its address
(``?run=...&step=N``) in a new session is timed too. ``--synthetic`` opens the file
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


TRIVIAL_PAGE = "import streamlit as st\n\nst.title('Trivial')\nst.write('one line')\n"


def _trivial(folder: Path) -> AppTest:
    """Streamlit's trivial page (a title and a line) in AppTest: what any rerun costs on this machine at
    this moment, timed beside each measure so that the machine's load is factored out."""
    page = folder / "trivial.py"
    page.write_text(TRIVIAL_PAGE, encoding="utf-8")
    at = AppTest.from_file(str(page), default_timeout=600)
    return at


def _paired(measure, trivial: AppTest, repeats: int) -> tuple[list[float], list[float]]:
    """``measure()`` and a rerun of the trivial page, interleaved ``repeats`` times (trivial first)."""
    page, base = [], []
    for i in range(repeats):
        base.append(_timed(trivial))
        page.append(measure(i))
    return page, base


def _step_changes(at: AppTest, steps: int, repeats: int, trivial: AppTest) -> tuple[list[float], list[float]]:
    """Seconds to redraw the page after a person picks another step (follow the latest: off), each beside
    a rerun of the trivial page."""
    at.checkbox(key="train_latest").uncheck()
    _timed(at)

    def pick(i: int) -> float:
        at.number_input(key="train_step").set_value(steps * (i + 1) // (repeats + 2))
        return _timed(at)

    return _paired(pick, trivial, repeats)


def _fresh(path: Path, query: dict[str, str] | None = None) -> AppTest:
    at = AppTest.from_file(str(ROOT / "pages" / "8_Training.py"), default_timeout=600)
    at.query_params["run"] = str(path)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    return at


def _go_to_step(path: Path, repeats: int, trivial: AppTest) -> tuple[list[float], list[float]]:
    """Seconds from pressing the verdict's "Go to step" to the page drawn at that step (a run with a
    finding), each in a session opened just before, beside a rerun of the trivial page."""
    def press(i: int) -> float:
        at = _fresh(path)
        _timed(at)
        if not [b for b in at.button if b.key == "train_verdict_go"]:
            return float("nan")
        at.button(key="train_verdict_go").click()
        return _timed(at)

    return _paired(press, trivial, repeats)


def _by_address(path: Path, step: int, repeats: int, trivial: AppTest) -> tuple[list[float], list[float]]:
    """Seconds to open a step by its address (``?run=...&step=N``), a new session on a warm server."""
    return _paired(lambda i: _timed(_fresh(path, {"step": str(step - i)})), trivial, repeats)


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
        trivial = _trivial(Path(tmp))
        _timed(trivial)  # its imports, once

        def open_fresh(i: int) -> float:  # a fresh session and an empty server cache each time
            ui_training.clear_cache()
            return _timed(_fresh(path))

        opens, open_base = _paired(open_fresh, trivial, args.repeats)
        at = _fresh(path)
        _timed(at)
        warm = statistics.median(_timed(at) for _ in range(args.repeats))
        grown, last = float("nan"), "-"
        if writer is not None:
            ones = np.ones((args.steps + 1, args.modules), np.float32)
            writer.write(_records(range(args.steps, args.steps + 1), ones))
            grown = _timed(at)
            last = next(m.value for m in at.metric if m.label == "Last step")
            writer.close()
        charts = _chart_bytes(at)
        picked, picked_base = _step_changes(at, args.steps, args.repeats, trivial)
        pressed, pressed_base = _go_to_step(path, args.repeats, trivial)
        address, address_base = _by_address(path, args.steps // 2, args.repeats, trivial)
        per_layer_s, per_layer_bytes = _per_layer_charts(args.steps, args.modules, args.per_layer_sample)
    med = statistics.median
    first = med(opens)
    print(f"{'what':44} {'seconds':>8} {'trivial':>8} {'net':>7} {'net/target':>10} {'chart MB':>9}")

    def row(what: str, page: list[float], base: list[float], target: float) -> float:
        net = med(p - b for p, b in zip(page, base, strict=True))
        print(f"{what:44} {med(page):8.2f} {med(base):8.2f} {net:7.2f} {net / target:10.2f}")
        return net

    net_open = row("Training page, first open (median)", opens, open_base, OPEN_S)
    print(f"{'':44} each open: {', '.join(f'{o:.2f}' for o in opens)} (the first also imports and loads "
          f"the sidebar model); largest chart {max(charts) / 1e6:.2f} MB")
    print(f"{'Training page, rerun, file unchanged':44} {warm:8.2f}")
    print(f"{'Training page, rerun after a step (to ' + last + ')':44} {grown:8.2f}")
    net_pick = row("Training page, a step picked (median)", picked, picked_base, STEP_S)
    net_press = (row("Go to step pressed (median)", pressed, pressed_base, STEP_S)
                 if not any(p != p for p in pressed) else float("nan"))
    row("a step opened by its address, new session", address, address_base, OPEN_S)
    print(
        f"{'one line chart per module (built, serialised)':44} {per_layer_s:8.2f} "
        f"{'':>8} {'':>7} {per_layer_s / OPEN_S:10.2f} "
        f"{per_layer_bytes / 1e6:9.1f}"
    )
    print(f"\nper-layer charts / Training page: {per_layer_s / first:.1f}x the time, "
          f"{per_layer_bytes / sum(charts):.0f}x the bytes sent ({len(charts)} charts on the page)")
    print("net: the page's seconds less the trivial Streamlit page's, timed just before it (the load "
          "factored out); targets on net: open 3 s, a step 0.5 s")
    ok = (net_open <= OPEN_S and net_pick <= STEP_S and max(charts) <= CHART_BYTES
          and not net_press > STEP_S)
    print("verdict:", "meets the targets" if ok else "MISSES a target")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
