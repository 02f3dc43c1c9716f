"""A followed run that grows fast: how long after its last append the Training page shows every step.

A run file of ``--first`` steps × ``--modules`` modules is written with the library's ``RunWriter`` (one
record batch per step, as the watch writes), then another process appends ``--mb`` megabytes of further
steps in ``--seconds`` seconds, in 56 even writes. The lag is the time from the last write to the moment
the reader holds the final step count.

- default: the page's reading in this process, as each rerun of the page does it (a ``LiveRun`` read,
  the loss line, the heatmap grid, once every ``REFRESH_S`` seconds, at once when a read took longer),
  steps laid out alike read at once (now) and one message at a time (before: ``ALIKE_MIN`` set out of
  reach), the two interleaved ``--repeats`` times, one torch thread.
- ``--browser``: the real app (``streamlit run app.py``, headless) in Chromium following the file by its
  address (``/Training?run=...``); the lag is until its "Steps" figure shows the final count.

Target: the page catches up within 5 s of the last append.

Run: ``.venv/bin/python benchmarks/bench_training_catchup.py [--modules 100] [--mb 360] [--seconds 14]
[--browser]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from inspector.watching import RunMeta, RunWriter, StepRecord  # noqa: E402

TARGET_S = 5.0
REFRESH_S = 3.0  # the page's following interval (pages/8_Training.py)
WRITES = 56
APPEND = """
import sys, time
src, dst, start, end, seconds, writes = sys.argv[1], sys.argv[2], *map(float, sys.argv[3:])
with open(src, 'rb') as f:
    f.seek(int(start)); data = f.read(int(end - start))
chunk, t0 = -(-len(data) // int(writes)), time.monotonic()
with open(dst, 'ab') as out:
    for i in range(int(writes)):
        out.write(data[i * chunk:(i + 1) * chunk]); out.flush()
        time.sleep(max(0.0, t0 + (i + 1) * seconds / writes - time.monotonic()))
print(time.time(), time.monotonic() - t0, flush=True)
"""


def write_source(path: Path, modules: int, first: int, mb: float) -> tuple[int, int, int]:
    """Write ``first`` steps, then enough more for ``mb`` megabytes, with ``RunWriter`` (left open: no
    end marker). Returns the bytes after the first steps, the bytes in all, and the steps in all."""
    names = tuple(f"model.layers.{i // 10}.block{i % 10}" for i in range(modules))
    meta = RunMeta(model="bench", world_size=1, every=1, modules=names,
                   parameters=tuple(f"{n}.weight" for n in names), parameter_modules=tuple(range(modules)))
    rng = np.random.default_rng(0)
    zeros = np.zeros(modules, np.int32)
    writer = RunWriter(path, meta)
    step, cut = 0, 0
    while True:
        norms = (1 + 0.1 * rng.standard_normal((500, modules))).astype(np.float32)
        for row in norms:
            writer.write([StepRecord(step=step, rank=0, time=float(step), loss=1.0 / (1 + step / 1000),
                                     grad_norm=float(np.sqrt((row ** 2).sum())), lr=[1e-3],
                                     module_grad_norm=row, module_nonfinite=zeros, param_grad_norm=row)])
            step += 1
            if step == first:
                cut = writer.bytes_written
            if step > first and writer.bytes_written - cut >= mb * 1e6:
                end = writer.bytes_written
                writer._file.close()  # a run still being written: no end marker
                return cut, end, step


def _start_append(source: Path, run: Path, cut: int, end: int, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", APPEND, str(source), str(run), str(cut), str(end),
                             str(seconds), str(WRITES)], stdout=subprocess.PIPE, text=True)


def _finished(appender: subprocess.Popen) -> float:
    """The wall-clock time (``time.time()``) of the last append."""
    return float(appender.stdout.read().split()[0])


def follow_in_process(source: Path, folder: Path, cut: int, end: int, steps: int, seconds: float,
                      at_once: bool) -> float:
    """The page's reading of a run growing by ``end - cut`` bytes in ``seconds``: seconds from the last
    append until a read holds ``steps`` steps."""
    import inspector.runfiles.tail as tail
    from inspector.figures import run_norm_grid
    from inspector.runfiles.alike import ALIKE_MIN
    from inspector.watching import LiveRun, main_steps

    run = folder / f"grow-{'now' if at_once else 'before'}.inspect"
    run.write_bytes(source.read_bytes()[:cut])
    tail.ALIKE_MIN = ALIKE_MIN if at_once else 1 << 62  # before: every message read alone
    live = LiveRun(run)
    live.read()
    appender = _start_append(source, run, cut, end, seconds)
    while True:
        started = time.monotonic()
        got = live.read()
        main_steps(got)
        run_norm_grid(got, "grad_norm", 0)
        if len(got.steps) == steps:
            done = time.time()
            break
        time.sleep(max(0.0, started + REFRESH_S - time.monotonic()))
    lag = done - _finished(appender)
    appender.wait()
    run.unlink()
    return lag


def follow_in_browser(source: Path, folder: Path, cut: int, end: int, steps: int, seconds: float) -> float:
    """The real app in Chromium following the run: seconds from the last append to its "Steps" figure
    showing ``steps``."""
    from playwright.sync_api import sync_playwright

    from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS, serve_app

    run = folder / "grow.inspect"
    run.write_bytes(source.read_bytes()[:cut])
    shown = """() => { const m = [...document.querySelectorAll('[data-testid="stMetric"]')]
        .find(e => e.innerText.startsWith('Steps')); return m ? m.innerText.split('\\n').pop() : null }"""
    env = dict(os.environ, INSPECTOR_RUNS=str(folder))
    with serve_app(folder / "streamlit.log", env=env) as server, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{server.url}/Training?run={run}", wait_until="domcontentloaded")
            deadline = time.monotonic() + 180
            while page.evaluate(shown) is None and time.monotonic() < deadline:
                time.sleep(0.25)
            time.sleep(REFRESH_S + 1)  # the page idle, following
            appender = _start_append(source, run, cut, end, seconds)
            want = f"{steps:,}"
            while page.evaluate(shown) != want and time.monotonic() < deadline + 600:
                time.sleep(0.1)
            done = time.time()
            lag = done - _finished(appender)
            appender.wait()
            return lag
        finally:
            browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", type=int, default=100)
    parser.add_argument("--first", type=int, default=1_368)
    parser.add_argument("--mb", type=float, default=360)
    parser.add_argument("--seconds", type=float, default=14)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--browser", action="store_true", help="the real app in Chromium (now only)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        source = folder / "source.bin"
        t = time.perf_counter()
        cut, end, steps = write_source(source, args.modules, args.first, args.mb)
        print(f"run file: {args.first:,} steps × {args.modules:,} modules, then {steps - args.first:,} more "
              f"({(end - cut) / 1e6:,.0f} MB, {(end - cut) / (steps - args.first):,.0f} bytes a step) "
              f"appended in {args.seconds:g} s; written in {time.perf_counter() - t:.0f} s")
        if args.browser:
            lag = follow_in_browser(source, folder, cut, end, steps, args.seconds)
            print(f"{'the page in Chromium (streamlit run app.py)':52} caught up {lag:6.2f} s after the "
                  "last append")
            ok = lag <= TARGET_S
        else:
            lags: dict[str, list[float]] = {"now": [], "before": []}
            for i in range(args.repeats):
                for name in (("now", "before") if i % 2 == 0 else ("before", "now")):
                    lags[name].append(follow_in_process(source, folder, cut, end, steps, args.seconds,
                                                        at_once=name == "now"))
            for name, what in (("now", "steps laid out alike read at once"),
                               ("before", "one message at a time")):
                print(f"{what:52} caught up {statistics.median(lags[name]):6.2f} s after the last append "
                      f"(each: {', '.join(f'{x:.2f}' for x in lags[name])})")
            ok = statistics.median(lags["now"]) <= TARGET_S
        print(f"target: caught up within {TARGET_S:g} s of the last append; verdict:",
              "met" if ok else "MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
