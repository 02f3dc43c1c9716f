"""alias_groups next to accelerate's find_tied_parameters and a bare walk of the tensors.

Target: alias_groups on llama-70b-meta takes at most 1.5x find_tied_parameters, although it
also groups buffers, parameter-buffer aliases and (on real memory) shared storage and views.
Repeats are interleaved and the median is reported.

    .venv/bin/python benchmarks/bench_aliases.py [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import interleaved  # noqa: E402
from accelerate.utils import find_tied_parameters  # noqa: E402
from torch import nn  # noqa: E402

from inspector.aliases import alias_groups, graph_data  # noqa: E402
from inspector.figures.aliases import alias_graph_figure  # noqa: E402
from sample_models import get_sample  # noqa: E402

TARGET = 1.5


def bare_walk(model: nn.Module) -> int:
    n = 0
    for _ in model.named_parameters(remove_duplicate=False):
        n += 1
    for _ in model.named_buffers(remove_duplicate=False):
        n += 1
    return n


def bench(name: str, repeats: int) -> float:
    model = get_sample(name).build()
    fns = {"alias_groups": alias_groups, "find_tied_parameters": find_tied_parameters,
           "bare walk": bare_walk}
    med = interleaved({k: (lambda fn=fn: fn(model)) for k, fn in fns.items()}, repeats)
    base = med["find_tied_parameters"]
    groups = alias_groups(model)
    print(f"{name}: {sum(1 for _ in model.named_parameters(remove_duplicate=False))} parameter names, "
          f"{sum(1 for _ in model.named_buffers(remove_duplicate=False))} buffer names, "
          f"{len(groups)} alias groups; median of {repeats}")
    for k, v in med.items():
        print(f"  {k:22} {v * 1e3:8.2f} ms   {v / base:5.2f}x find_tied_parameters")
    return med["alias_groups"] / base


def bench_figure(name: str, repeats: int = 3) -> None:
    model = get_sample(name).build()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fig = alias_graph_figure(graph_data(model))
        times.append(time.perf_counter() - t0)
    marks = sum(len(tr.x) for tr in fig.data if tr.x is not None)
    print(f"alias_graph_figure on {name}: {statistics.median(times) * 1e3:.0f} ms, {len(fig.data)} traces, "
          f"{marks} points; {fig.layout.title.text}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--samples", nargs="*", default=["llama-70b-meta", "tiny-gpt2"])
    parser.add_argument("--figures", nargs="*", default=["llama-70b-meta", "gpt2-small"])
    args = parser.parse_args()
    ratios = {name: bench(name, args.repeats) for name in args.samples}
    ratio = ratios.get("llama-70b-meta", next(iter(ratios.values())))
    verdict = "meets" if ratio <= TARGET else "misses"
    print(f"alias_groups / find_tied_parameters on {args.samples[0]}: {ratio:.2f}x "
          f"({verdict} the target of at most {TARGET}x)")
    for name in args.figures:
        bench_figure(name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
