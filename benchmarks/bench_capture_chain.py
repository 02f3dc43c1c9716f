"""Capture on long chains of modules grows linearly with the chain, side by side with clone hooks.

Chains (``nn.Sequential`` of N modules, input 1 x 4, no_grad and inference mode):
  linear     N ``nn.Linear(4, 4)``: every module returns a new tensor
  identity   N ``nn.Identity()``: every module hands the same tensor on (one storage, N captures)
  relu-ip    N ``nn.ReLU(inplace=True)``: every module writes the same tensor in place

Every capture of the same tensor object is watched for in-place writes; a watch that compared
each later write with every earlier capture grew as N^2 on the last two chains. Prints, for
N = 2k, 4k, 8k (and 16k with ``--big``): seconds of capture_activations and of clone hooks, and
the growth from one N to the next (2.0 is linear).

Run: ``python benchmarks/bench_capture_chain.py [--repeats 3] [--big]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _hooks import clone, hooked  # noqa: E402
from _timing import interleaved  # noqa: E402

from inspector.capture import capture_activations  # noqa: E402

CHAINS = {
    "linear": lambda: nn.Linear(4, 4),
    "identity": nn.Identity,
    "relu-ip": lambda: nn.ReLU(inplace=True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--big", action="store_true", help="also 16k modules")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [2000, 4000, 8000] + ([16000] if args.big else [])
    print(f"torch {torch.__version__}; median of {args.repeats}; seconds (growth from the size before)")
    print(f"{'chain':10} {'mode':10} " + " ".join(f"{n:>19}" for n in sizes))
    for chain, make in CHAINS.items():
        for mode in ("no_grad", "inference"):
            cells, before = [], None
            for n in sizes:
                model = nn.Sequential(*[make() for _ in range(n)]).eval()
                ctx = torch.inference_mode if mode == "inference" else torch.no_grad

                def inspector(model=model, ctx=ctx):
                    with ctx():
                        return capture_activations(model, torch.ones(1, 4))

                def hooks(model=model, ctx=ctx):
                    with ctx():
                        return hooked(model, lambda: model(torch.ones(1, 4)), clone)

                t = interleaved({"inspector": inspector, "clone-hooks": hooks}, args.repeats)
                growth = f"x{t['inspector'] / before:.1f}" if before else "    "
                cells.append(f"{t['inspector']:6.2f} {growth} ({t['clone-hooks']:5.2f})")
                before = t["inspector"]
            print(f"{chain:10} {mode:10} " + " ".join(f"{c:>19}" for c in cells), flush=True)
    print("cells: inspector seconds, growth, (clone hooks seconds)")


if __name__ == "__main__":
    main()
