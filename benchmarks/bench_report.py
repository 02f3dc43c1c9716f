"""The HTML report of gpt2-small: time after loading and file size, against the issue's targets.

Side by side, in one run with interleaved repeats (median):

* ours: ``build_report(loaded)`` then ``Report.to_html()`` with the default options: every
  section that needs no GPU (on a CPU the report leaves attribution out above 64 MiB:
  Integrated Gradients is 50 forward and backward passes of the whole model, a GPU-sized job
  at this scale; ``--with-attribution`` runs it anyway), plotly.js once for every figure, packed
  (packing takes about 3 s, once per process: in the first repeat's to_html);
* what people do today: save each of the same figures with plotly's own
  ``fig.to_html(include_plotlyjs=True)`` (plotly.js inlined in every file), plus the tables as
  ``DataFrame.to_html``.

Targets: at most 5 s after loading, at most 8 MB; and the report of the 4,080-parameter
``sample:tiny-gpt2`` at most 1.5 MB (it must fit in an e-mail).

    .venv/bin/python benchmarks/bench_report.py [--repeats 3] [--sample gpt2-small]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pandas as pd  # noqa: E402
import plotly.graph_objects as go  # noqa: E402
import torch  # noqa: E402

from inspector.loading.models import call_model, load_model  # noqa: E402
from inspector.report import Report, build_report  # noqa: E402

TARGET_SECONDS = 5.0
TARGET_BYTES = 8 * 1024 * 1024
TARGET_SMALL_BYTES = 1_500_000


SECTION_SECONDS: dict[str, list[float]] = {}


def ours(loaded, options) -> tuple[float, float, int, Report]:
    marks: list[tuple[str, float]] = []

    def progress(message: str) -> None:
        if message.startswith("report section ") and ":" in message:
            marks.append((message.split()[2].rstrip(":"), time.perf_counter()))

    t0 = time.perf_counter()
    report = build_report(loaded, progress=progress, **options)
    t1 = time.perf_counter()
    for (sid, start), (_, end) in zip(marks, [*marks[1:], ("", t1)], strict=True):
        SECTION_SECONDS.setdefault(sid, []).append(end - start)
    html = report.to_html()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, len(html.encode("utf-8")), report


def usual(report: Report) -> tuple[float, int]:
    """Each figure saved with plotly.js inlined, each table with pandas: time and total bytes."""
    t0 = time.perf_counter()
    total = 0
    for s in report.sections:
        for f in s.figures:
            total += len(go.Figure(f.figure).to_html(include_plotlyjs=True, full_html=True).encode("utf-8"))
        for t in s.tables:
            total += len(
                pd.DataFrame([list(r) for r in t.rows], columns=list(t.columns)).to_html().encode("utf-8")
            )
    return time.perf_counter() - t0, total


def plain_forward(loaded) -> float:
    """One forward pass of the model on its example inputs: how fast this machine is right now."""
    inputs = loaded.example_inputs(2)
    t0 = time.perf_counter()
    with torch.no_grad():
        call_model(loaded.model, inputs)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", default="gpt2-small")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--with-attribution", action="store_true")
    args = parser.parse_args()
    options = {"attribution_cpu_max_bytes": None} if args.with_attribution else {}
    t0 = time.perf_counter()
    loaded = load_model(f"sample:{args.sample}")
    print(f"loaded sample:{args.sample} in {time.perf_counter() - t0:.1f} s (not counted); "
          f"options: {options or 'defaults'}")
    build_times, html_times, sizes, usual_times, usual_sizes, forwards = [], [], [], [], [], []
    report = None
    for i in range(args.repeats):
        forwards.append(plain_forward(loaded))
        b, h, n, report = ours(loaded, options)
        u, un = usual(report)
        build_times.append(b)
        html_times.append(h)
        sizes.append(n)
        usual_times.append(u)
        usual_sizes.append(un)
        print(f"  repeat {i + 1}: build {b:.2f} s + html {h:.2f} s, {n / 2**20:.2f} MiB | "
              f"per-figure plotly files {u:.2f} s, {un / 2**20:.2f} MiB")
    total = statistics.median(b + h for b, h in zip(build_times, html_times, strict=True))
    size = statistics.median(sizes)
    figures = sum(len(s.figures) for s in report.sections)
    statuses = [(s.id, s.status) for s in report.sections]
    print()
    print(f"figures: {figures}; sections: {', '.join(f'{sid} ({st})' for sid, st in statuses)}")
    print("per section (median s): " + ", ".join(f"{sid} {statistics.median(v):.2f}"
                                                 for sid, v in SECTION_SECONDS.items()))
    print(
        f"ours: build {statistics.median(build_times):.2f} s + to_html {statistics.median(html_times):.2f} s "
        f"= {total:.2f} s (target <= {TARGET_SECONDS:.0f} s: ratio {total / TARGET_SECONDS:.2f}, "
        f"{'met' if total <= TARGET_SECONDS else 'NOT met'})"
    )
    print(f"ours: one file of {size / 2**20:.2f} MiB (target <= {TARGET_BYTES / 2**20:.0f} MiB: ratio "
          f"{size / TARGET_BYTES:.2f}, {'met' if size <= TARGET_BYTES else 'NOT met'})")
    u_size = statistics.median(usual_sizes)
    fwd = statistics.median(forwards)
    print(f"reference: one plain forward pass (batch 2) takes {fwd:.2f} s on this machine now; the report "
          f"costs {total / fwd:.1f} of them")
    print(
        f"usual (plotly.js in every figure file): {statistics.median(usual_times):.2f} s to write, "
        f"{u_size / 2**20:.2f} MiB in {figures} figure files + tables; ours is {size / u_size:.2f}x the bytes"
    )
    small = len(build_report(load_model("sample:tiny-gpt2")).to_html().encode("utf-8"))
    print(f"the report of sample:tiny-gpt2: {small:,} bytes (target <= {TARGET_SMALL_BYTES:,}: ratio "
          f"{small / TARGET_SMALL_BYTES:.2f}, {'met' if small <= TARGET_SMALL_BYTES else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
