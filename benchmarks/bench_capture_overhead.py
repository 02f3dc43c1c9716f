"""Per-module cost of ``capture_activations`` next to hand-written clone hooks, in one run.

Models:
  llama-deep  a 28-layer, width-64 Llama built from a ``transformers`` config (371 modules),
              batch 1 x 16 tokens: Python work per hook dominates, as on a big model on a GPU.
  cnn-bn      the small ``cnn-bn`` sample (batch 8).

Variants, run in a rotating order in every repeat (one CPU thread, inference mode, or no_grad
with ``--mode no_grad``, where outputs have version counters):
  plain         model(x), no hooks
  clone-hooks   a forward hook on every module keeping ``output.detach().clone()`` (tensor
                items of a tuple, list, dict or model output cloned the same way; the model's
                own output is not kept, as ``capture_activations`` does not copy it either),
                the baseline people write
  no-op-hooks   a forward hook on every module that does nothing (the floor)
  inspector     capture_activations(model, x), every module, copies on the CPU
  unwatched     the same with watch_mutations=False: no in-place write watch, and copies made in
                inference mode kept as inference tensors

Per-module overhead = (median paired time - plain) / modules, by the wall clock and by this
process's CPU time (on a machine shared with other work the CPU time is the steadier of the
two; with one thread it is the work done). Target: inspector's per-module overhead on
llama-deep at most 2x that of the clone hooks (the unwatched capture: at most 1.3x).

Run: ``python benchmarks/bench_capture_overhead.py [--repeats 21] [--model llama-deep,cnn-bn]``
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _hooks import clone, hooked  # noqa: E402

from inspector.capture import capture_activations, tensor_leaves  # noqa: E402
from sample_models import get_sample  # noqa: E402

TARGET = 2.0
FAST_TARGET = 1.3


def deep_llama() -> tuple[nn.Module, dict]:
    """28 layers of width 64 (371 modules) from a transformers LlamaConfig, and a 1 x 16 batch."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=28,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    return model, {"input_ids": torch.randint(0, 256, (1, 16)), "use_cache": False}


def cnn_bn() -> tuple[nn.Module, torch.Tensor]:
    sample = get_sample("cnn-bn")
    return sample.build().eval(), sample.example_inputs(8)


def call(model: nn.Module, x) -> object:
    return model(**x) if isinstance(x, dict) else model(x)


def paired(variants: dict[str, Callable[[], object]], repeats: int,
           clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {n: [] for n in variants}
    names = list(variants)
    for name in names:  # warm-up
        variants[name]()
    for i in range(repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            gc.collect()
            t = clock()
            result = variants[name]()
            times[name].append(clock() - t)
            del result
    return times


MODES = {"inference": torch.inference_mode, "no_grad": torch.no_grad}


def bench(label: str, model: nn.Module, x, repeats: int, mode: str = "inference") -> float:
    modules = sum(1 for _ in model.named_modules())
    variants = {
        "plain": lambda: call(model, x),
        "clone-hooks": lambda: hooked(model, lambda: call(model, x), clone),
        "no-op-hooks": lambda: hooked(model, lambda: call(model, x), None),
        "inspector": lambda: capture_activations(model, x),
        "unwatched": lambda: capture_activations(model, x, watch_mutations=False),
    }
    with MODES[mode]():
        runs = {"wall": paired(variants, repeats), "cpu": paired(variants, repeats, time.process_time)}
        cap = capture_activations(model, x)
        kept = hooked(model, lambda: call(model, x), clone)
    ours = [t for v in cap.outputs.values() for _, t in tensor_leaves(v)]
    theirs = [t for v in kept.values() for _, t in tensor_leaves(v)]
    print(
        f"== {label}, {mode}: {modules} modules, {repeats} paired repeats, "
        f"{torch.get_num_threads()} thread(s), "
        f"load average {os.getloadavg()[0]:.2f}; copies kept: inspector {len(ours)} tensors, "
        f"{sum(t.nbytes for t in ours) / 1024:.0f} KiB; clone hooks {len(theirs)} tensors, "
        f"{sum(t.nbytes for t in theirs) / 1024:.0f} KiB"
    )
    ratios = {}
    for clock, times in runs.items():
        plain = times["plain"]
        print(f"   {clock + ' clock':<13}{'median ms':>10}{'x plain':>9}{'us/module':>11}")
        over = {}
        for name, ts in times.items():
            ratio = statistics.median(t / p for t, p in zip(ts, plain, strict=True))
            extra = statistics.median(t - p for t, p in zip(ts, plain, strict=True))
            over[name] = extra / modules
            print(f"   {name:<13}{statistics.median(ts) * 1e3:>10.2f}{ratio:>9.2f}{over[name] * 1e6:>11.1f}")
        ratios[clock] = over["inspector"] / over["clone-hooks"]
        print(f"   per-module overhead ({clock} clock), inspector / clone hooks: {ratios[clock]:.2f}x "
              f"(target <= {TARGET}x: {'OK' if ratios[clock] <= TARGET else 'MISSED'})")
        fast = over["unwatched"] / over["clone-hooks"]
        print(f"   per-module overhead ({clock} clock), unwatched / clone hooks: {fast:.2f}x "
              f"(target <= {FAST_TARGET}x: {'OK' if fast <= FAST_TARGET else 'MISSED'})")
    return ratios["wall"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--model", default="llama-deep,cnn-bn")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mode", default="inference", choices=list(MODES),
                        help="inference: tensors without version counters; no_grad: with them")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}")
    for label in args.model.split(","):
        model, x = deep_llama() if label == "llama-deep" else cnn_bn()
        bench(label, model, x, args.repeats, args.mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
