"""Activation capture speed on gpt2-small (batch 4 x 128, inference mode), paired ratios.

Each repeat runs every variant once, in a rotating order, and divides its time by the
plain forward of the same repeat; the figures are medians of those paired ratios.

Variants:
  plain          model(x), no hooks
  inspector-all  capture_activations(every module): detached copies into pooled CPU memory
  inspector-3    capture_activations(three modules)
  bare-refs      a naive hook that keeps ``output`` (a reference, not a copy) for every module
  fresh-clones   a hook that keeps ``output.detach().clone()`` (a fresh allocation each time)
  tl-cache       TransformerLens ``run_with_cache`` (only if transformer_lens is installed)

Targets: inspector-all <= 1.10x, inspector-3 <= 1.02x (bare references cost about 1.06x).
Both wall-clock and process CPU-time ratios are printed: on a machine shared with other
work the CPU time of this process is the steadier of the two.

Run: ``python benchmarks/bench_capture.py [--repeats 7] [--device cpu] [--threads 1]``
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inspector.capture import capture_activations  # noqa: E402
from sample_models import get_sample  # noqa: E402

THREE = ["transformer.h.0", "transformer.h.5.mlp", "transformer.ln_f"]
TARGETS = {"inspector-all": 1.10, "inspector-3": 1.02, "bare-refs": 1.06}


def naive(model: torch.nn.Module, x: torch.Tensor, clone: bool) -> dict:
    store: dict[str, torch.Tensor] = {}
    handles = []
    for name, module in model.named_modules():
        if not name:
            continue

        def hook(m, a, out, name=name):
            store[name] = out.detach().clone() if clone else out
        handles.append(module.register_forward_hook(hook))
    try:
        model(x)
    finally:
        for h in handles:
            h.remove()
    return store


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    sync(device)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    del result
    gc.collect()
    return wall, cpu


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (1 gives steadier figures on a busy machine)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sample = get_sample("gpt2-small")
    model = sample.build().eval().to(device)
    x = sample.example_inputs(args.batch).to(device)  # (4, 128) token ids
    variants: dict[str, Callable[[], object]] = {
        "plain": lambda: model(x),
        "inspector-all": lambda: capture_activations(model, x),
        "inspector-3": lambda: capture_activations(model, x, modules=THREE),
        "bare-refs": lambda: naive(model, x, clone=False),
        "fresh-clones": lambda: naive(model, x, clone=True),
    }
    if importlib.util.find_spec("transformer_lens") is None:
        print("transformer_lens is not installed: the run_with_cache comparison is skipped")
    else:
        print("transformer_lens is installed, but its HookedTransformer needs pretrained gpt2 "
              "weights that are not available offline here: run_with_cache is skipped")
    print(f"gpt2-small, batch {tuple(x.shape)}, {device}, inference mode, "
          f"{torch.get_num_threads()} CPU threads, {args.repeats} paired repeats")
    names = list(variants)
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    with torch.inference_mode():
        for name in names:  # warm-up: allocator, pooled capture memory, caches
            timed(variants[name], device)
        for i in range(args.repeats):
            order = names[i % len(names):] + names[:i % len(names)]
            for name in order:
                times[name].append(timed(variants[name], device))
        cap = capture_activations(model, x)
    print(f"captured bytes (every module): {cap.total_bytes / 2**20:.1f} MiB in {len(cap.outputs)} copies")
    del cap
    for clock, k in (("wall clock", 0), ("process CPU time (less sensitive to other load)", 1)):
        plain = [t[k] for t in times["plain"]]
        print(f"\n{clock}: median of paired ratios to the plain forward of the same repeat")
        print(f"{'variant':<15}{'median s':>10}{'ratio':>8}{'of medians':>12}{'target':>10}  verdict")
        for name in names:
            mine = [t[k] for t in times[name]]
            ratio = statistics.median(t / p for t, p in zip(mine, plain, strict=True))
            target = TARGETS.get(name)
            verdict = "" if target is None else ("ok" if ratio <= target else "OVER")
            tgt = f"<= {target:.2f}" if target else ""
            of_medians = statistics.median(mine) / statistics.median(plain)
            print(
                f"{name:<15}{statistics.median(mine):>10.3f}{ratio:>8.3f}{of_medians:>12.3f}"
                f"{tgt:>10}  {verdict}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
