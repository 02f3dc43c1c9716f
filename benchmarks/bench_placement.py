"""plan_device_map next to accelerate's infer_auto_device_map; audit_device_map next to check_device_map.

On llama-70b-meta (80 layers on the meta device) with four 20 GiB GPUs and 200 GiB of CPU:

* ``plan_device_map`` (which also places every buffer and keeps ties) at most 0.5x the time
  of ``accelerate.infer_auto_device_map`` with the same budget and no-split classes;
* ``audit_device_map`` (a row per tensor name with device, primary device, split flag and
  findings) at most 1x the time of ``accelerate.utils.check_device_map`` on the same map.

Repeats are interleaved (the order flips every repeat) and the median is reported.

    .venv/bin/python benchmarks/bench_placement.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import interleaved  # noqa: E402
from accelerate import infer_auto_device_map  # noqa: E402
from accelerate.utils import check_device_map  # noqa: E402

from inspector.placement import accelerate_budget, audit_device_map, parse_max_memory, plan_device_map  # noqa: E402
from sample_models import get_sample  # noqa: E402

BUDGET = "0=20GiB,1=20GiB,2=20GiB,3=20GiB,cpu=200GiB"
TARGETS = {"plan": 0.5, "audit": 1.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    logging.getLogger("accelerate").setLevel(logging.ERROR)  # "Device 0 is not available"
    warnings.simplefilter("ignore", UserWarning)
    model = get_sample("llama-70b-meta").build()
    budget = parse_max_memory(BUDGET)
    no_split = list(model._no_split_modules)
    ours = plan_device_map(model, budget)
    theirs = infer_auto_device_map(
        model, max_memory=accelerate_budget(budget), no_split_module_classes=no_split
    )
    print(f"llama-70b-meta, budget {BUDGET}: our map {len(ours)} keys, accelerate's {len(theirs)} keys, "
          f"{'identical' if ours == dict(theirs) else 'different'}; median of {args.repeats}")
    plan = interleaved({
        "plan_device_map": lambda: plan_device_map(model, budget),
        "infer_auto_device_map": lambda: infer_auto_device_map(
            model, max_memory=accelerate_budget(budget), no_split_module_classes=no_split),
    }, args.repeats, order="flip")
    audit = interleaved({
        "audit_device_map": lambda: audit_device_map(model, ours),
        "check_device_map": lambda: check_device_map(model, ours),
    }, args.repeats, order="flip")
    ratios = {"plan": plan["plan_device_map"] / plan["infer_auto_device_map"],
              "audit": audit["audit_device_map"] / audit["check_device_map"]}
    for k, v in {**plan, **audit}.items():
        print(f"  {k:22} {v * 1e3:8.2f} ms")
    ok = True
    for key, ratio in ratios.items():
        passed = ratio <= TARGETS[key]
        ok &= passed
        print(f"  {key:6} ratio {ratio:5.2f}x  (target <= {TARGETS[key]}x)  {'ok' if passed else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
