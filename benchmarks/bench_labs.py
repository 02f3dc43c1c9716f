"""Every package lab: building its scenario, and checking each task's passing answer, one torch thread.

A class opens labs all at once on one laptop: each build should take under 1 s and each check
under 0.1 s, the checks that train the model again to try the student's fix included (the late
overflow's and the stalled schedule's second tasks: 20 and 24 watched steps). Medians over
interleaved rounds (every lab built in turn, then every check in turn).

Run: ``python benchmarks/bench_labs.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import interleaved  # noqa: E402

from inspector.labs import discover_labs, grade  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    labs = discover_labs(labs_dir="")
    builds = interleaved({lab.id: lab.build for lab in labs}, args.repeats)
    scenarios = {lab.id: lab.build() for lab in labs}
    checks = {}
    for lab in labs:
        sc = scenarios[lab.id]
        for task in lab.tasks:
            answers = task.solution_for(sc)
            checks[f"{lab.id}/{task.id}"] = (lambda lab=lab, task=task, sc=sc, a=answers:
                                             grade(lab, task.id, sc, a))
    checked = interleaved(checks, args.repeats)
    print(f"{'lab':<20} {'build s':>8}")
    for lab in labs:
        print(f"{lab.id:<20} {builds[lab.id]:>8.3f}")
    print(f"\n{'task':<36} {'check s':>8}")
    for name, seconds in checked.items():
        print(f"{name:<36} {seconds:>8.4f}")
    slow = [f"build {k}" for k, v in builds.items() if v >= 1.0] + [f"check {k}" for k, v in checked.items()
                                                                     if v >= 0.1]
    if slow:
        print("over target:", ", ".join(slow))
        sys.exit(1)


if __name__ == "__main__":
    main()
