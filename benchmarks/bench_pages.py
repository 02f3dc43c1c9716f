"""Dashboard speed with gpt2-small loaded: first render and warm rerun of every page, chart sizes.

Targets: first render of each page at most 3 s after the model is loaded, a warm rerun at
most 0.5 s, and no chart message over 1 MB. Each page is opened in a fresh AppTest session
(the model is already in the server-wide cache, as it is for a user who loaded it on another
page); the figure size is the length of the plotly JSON the server sends to the browser.

Run: ``.venv/bin/python benchmarks/bench_pages.py [--model sample:gpt2-small] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamlit.testing.v1 import AppTest  # noqa: E402

FIRST_S, WARM_S, CHART_BYTES = 3.0, 0.5, 1_000_000


def _open(script: Path, model: str, device: str) -> AppTest:
    at = AppTest.from_file(str(script), default_timeout=600)
    at.query_params["model"] = model
    at.query_params["device"] = device
    return at


def _chart_sizes(at: AppTest) -> list[int]:
    return [len(el.proto.spec.encode()) for el in at.get("plotly_chart")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="sample:gpt2-small")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=3, help="warm reruns per page (median)")
    args = parser.parse_args()

    scripts = [ROOT / "app.py", *sorted((ROOT / "pages").glob("*.py"))]
    t0 = time.perf_counter()
    home = _open(scripts[0], args.model, args.device).run()
    load_s = time.perf_counter() - t0
    if home.exception:
        print(home.exception[0].value)
        return 1
    print(f"{args.model} on {args.device}: loaded (with the home page) in {load_s:.2f} s\n")
    print(f"{'page':22} {'first s':>8} {'/target':>7} {'warm s':>7} {'/target':>7} {'charts':>6} "
          f"{'max chart':>10} {'/target':>7}  verdict")
    failed = 0
    for script in scripts:
        at = _open(script, args.model, args.device)
        t = time.perf_counter()
        at.run()
        first = time.perf_counter() - t
        warm = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            at.run()
            warm.append(time.perf_counter() - t)
        sizes = _chart_sizes(at)
        warm_s = statistics.median(warm)
        problems = []
        if at.exception:
            problems.append("exception: " + at.exception[0].value.splitlines()[0][:80])
        if first > FIRST_S:
            problems.append(f"first {first / FIRST_S:.1f}x target")
        if warm_s > WARM_S:
            problems.append(f"warm {warm_s / WARM_S:.1f}x target")
        if sizes and max(sizes) > CHART_BYTES:
            problems.append(f"chart {max(sizes) / CHART_BYTES:.1f}x target")
        failed += bool(problems)
        biggest = max(sizes, default=0)
        print(f"{script.stem:22} {first:8.2f} {first / FIRST_S:7.2f} {warm_s:7.2f} {warm_s / WARM_S:7.2f} "
              f"{len(sizes):6d} {biggest / 1e3:8.0f}kB {biggest / CHART_BYTES:7.2f}  "
              + ("; ".join(problems) if problems else "ok"))
    print(f"\ntargets: first render <= {FIRST_S} s, warm rerun <= {WARM_S} s, chart <= "
          f"{CHART_BYTES / 1e6:.0f} MB (ratio <= 1.00 meets it); "
          f"{len(scripts) - failed} of {len(scripts)} pages within all targets")
    return 0 if not failed else 2


if __name__ == "__main__":
    raise SystemExit(main())
