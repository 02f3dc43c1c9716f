"""``python -m benchmarks.bugzoo [--only PATTERN] [--steps N] [--baselines] [--markdown FILE]``:
run the bug zoo under the watch (default options, and ``nonfinite=True`` where the producer check
matters), print one table and the summary figures."""

from __future__ import annotations

import argparse
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bugzoo", description=__doc__)
    parser.add_argument("--only",
                        help="comma-separated case-name patterns (globs; a word matches a substring)")
    parser.add_argument("--steps", type=int, help="cap every case at N steps (healthy cases run 200)")
    parser.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=False,
                        help="also run the bugs under detect_anomaly, DebugUnderflowOverflow, "
                             "TerminateOnNaN and TensorBoard scalars")
    parser.add_argument("--nonfinite", action=argparse.BooleanOptionalAction, default=True,
                        help="run the bugs that name a producer check again with nonfinite=True")
    parser.add_argument("--healthy-nonfinite", action=argparse.BooleanOptionalAction, default=False,
                        help="run the healthy cases again with nonfinite=True (the producer check's false "
                             "alarms)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the tables as Markdown to FILE")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # config notes on the tiny models, once per case
    except ImportError:  # pragma: no cover - the HF cases then report a crash each
        pass

    from .baselines import healthy_scalars, run_baselines
    from .runner import run_zoo, select
    from .table import baseline_table, goals_line, healthy_baseline_table, progress_line, summary, zoo_tables

    cases = select(args.only)
    if args.list:
        for c in cases:
            print(f"{c.name:34} {c.model:6} {c.stack:10} {'healthy' if c.healthy else ','.join(c.expect)}")
        return 0
    if not cases:
        print(f"no case matches {args.only!r} (see --list)", file=sys.stderr)
        return 2
    start = time.perf_counter()
    rows = run_zoo(cases, steps=args.steps, nonfinite=args.nonfinite,
                   healthy_nonfinite=args.healthy_nonfinite,
                   progress=lambda j: print(progress_line(j), file=sys.stderr, flush=True))
    text = zoo_tables(rows) + "\n\n" + summary(rows)
    if args.baselines:
        said = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
        text += "\n\n" + baseline_table(run_baselines(cases, steps=args.steps, rows=rows, progress=said))
        text += "\n\n" + healthy_baseline_table(healthy_scalars(cases, steps=args.steps))
    text += "\n\n" + goals_line(rows)
    text += f"\n\nThe zoo took {time.perf_counter() - start:.0f} s (torch {torch.__version__}, one thread).\n"
    print(text)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
