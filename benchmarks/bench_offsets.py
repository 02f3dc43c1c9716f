"""offset_map and gradient norms against what people write today, side by side in one run.

1. ``offset_map`` on ``llama-70b-meta`` (723 tensors on the meta device) against a bare walk of
   ``named_parameters()`` that accumulates offsets. Target: at most 3x.
2. ``gradient_report`` (norms by parameter *and* by module, one pass), and two ``gradient_norms``
   calls (by parameter, then by module: two passes, nothing is cached) on ``gpt2-small`` after a
   backward pass, against the norm of one flat vector of the same gradients:
   ``vector_norm(stack(_foreach_norm(grads)))`` (what ``clip_grad_norm_`` does) and
   ``vector_norm(cat(g.reshape(-1)))``. Target: at most 1.5x the faster of the two.
3. Peak memory growth while each runs, against the model's bytes. Target: well under 5%.
   Measured two ways: the process's resident set size (psutil), sampled every 0.2 ms by a
   thread while the call runs (torch allocates big CPU tensors with mmap, so RSS sees them),
   and Python's own heap (tracemalloc, which does not see torch's allocations). On CUDA,
   ``torch.cuda.max_memory_allocated`` is used as well.

Timings interleave the contenders and report medians. Run: ``python benchmarks/bench_offsets.py
[--device cuda] [--repeats N]``.
"""

from __future__ import annotations

import argparse
import gc
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import interleaved  # noqa: E402

from inspector.loading.models import load_model  # noqa: E402
from inspector.offsets import gradient_norms, gradient_report, offset_map, run_backward  # noqa: E402
from inspector.structure.summary import format_bytes  # noqa: E402


class PeakRSS:
    """Highest resident set size seen while the block runs, sampled by a thread."""

    def __init__(self, interval: float = 0.0002) -> None:
        self.interval = interval
        self.proc = psutil.Process()

    def __enter__(self) -> PeakRSS:
        gc.collect()
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc) -> None:
        self.peak = max(self.peak, self.proc.memory_info().rss)
        self._stop.set()
        self._thread.join()

    @property
    def growth(self) -> int:
        return self.peak - self.base


def memory_growth(fn: Callable[[], object], device: torch.device) -> dict[str, int]:
    tracemalloc.start()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        cuda_base = torch.cuda.memory_allocated(device)
    with PeakRSS() as rss:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
    _, py_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    out = {"rss": rss.growth, "python heap": py_peak}
    if device.type == "cuda":
        out["cuda allocator"] = torch.cuda.max_memory_allocated(device) - cuda_base
    return out


def verdict(ratio: float, target: float) -> str:
    return f"{ratio:.2f}x (target <= {target}x: {'OK' if ratio <= target else 'MISSED'})"


def bench_offset_map(repeats: int) -> None:
    loaded = load_model("sample:llama-70b-meta", device="meta")
    model = loaded.model

    def bare_walk() -> list:
        rows, offset = [], 0
        for name, p in model.named_parameters():
            n = p.numel()
            rows.append((name, offset, offset + n, tuple(p.shape)))
            offset += n
        return rows

    t = interleaved({"bare walk": bare_walk, "offset_map": lambda: offset_map(model)}, repeats)
    print(f"== offset_map on llama-70b-meta ({len(bare_walk())} tensors, meta device)")
    print(f"   bare walk of named_parameters(): {t['bare walk'] * 1e3:8.2f} ms")
    print(f"   offset_map:                      {t['offset_map'] * 1e3:8.2f} ms")
    print(f"   ratio: {verdict(t['offset_map'] / t['bare walk'], 3)}")
    mem = memory_growth(lambda: offset_map(model), torch.device("cpu"))
    print(f"   peak memory growth: RSS {format_bytes(mem['rss'])}, Python heap "
          f"{format_bytes(mem['python heap'])} (a flat vector would be "
          f"{format_bytes(sum(p.numel() for p in model.parameters()) * 4)})")


def bench_gradient_norms(repeats: int, device: str) -> None:
    print("== gradient norms on gpt2-small after one backward pass")
    loaded = load_model("sample:gpt2-small", device=device)
    model = loaded.model
    dev = next(model.parameters()).device
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    result = run_backward(loaded, batch_size=2)
    print(f"   {result.message} ({result.seconds:.1f} s)")
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    grad_bytes = sum(g.numel() * g.element_size() for g in grads)

    def foreach_norm() -> float:
        return float(torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads))))

    def cat_norm() -> float:
        return float(torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in grads])))

    def both_tables() -> float:
        return gradient_report(model).total_norm

    def two_calls() -> None:
        gradient_norms(model, by="parameter")
        gradient_norms(model, by="module")  # a second pass: use gradient_report for both tables

    assert abs(both_tables() - foreach_norm()) <= 1e-4 * foreach_norm(), "norms disagree"
    t = interleaved({"foreach": foreach_norm, "cat": cat_norm, "report": both_tables, "two": two_calls},
                    repeats, sync)
    best = min(t["foreach"], t["cat"])
    print(f"   {len(grads)} gradients, {sum(g.numel() for g in grads):,} elements, "
          f"{format_bytes(grad_bytes)} on {dev}")
    print(f"   vector_norm(stack(_foreach_norm(grads))):     {t['foreach'] * 1e3:8.2f} ms")
    print(f"   vector_norm(cat(flattened grads)):            {t['cat'] * 1e3:8.2f} ms")
    print(f"   gradient_report (by parameter + by module):   {t['report'] * 1e3:8.2f} ms")
    print(f"   gradient_norms(by='parameter') then 'module': {t['two'] * 1e3:8.2f} ms")
    print(f"   ratio gradient_report / fastest flat norm: {verdict(t['report'] / best, 1.5)}")
    print(f"   ratio gradient_report / cat flat norm:     {t['report'] / t['cat']:.2f}x")
    print(f"   ratio two separate calls / fastest:        {t['two'] / best:.2f}x (two passes; "
          "gradient_report gives both tables from one)")
    print(f"== peak memory growth on gpt2-small (model {format_bytes(model_bytes)}; 5% = "
          f"{format_bytes(model_bytes * 0.05)})")
    for label, fn in [("offset_map", lambda: offset_map(model)), ("gradient_report", both_tables),
                      ("flat cat norm (for contrast)", cat_norm)]:
        mem = memory_growth(fn, dev)
        shown = ", ".join(f"{k} {format_bytes(v)} ({100 * v / model_bytes:.2f}%)" for k, v in mem.items())
        print(f"   {label:30} {shown}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="device for gpt2-small (cpu, cuda)")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    bench_offset_map(max(args.repeats, 30))
    bench_gradient_norms(args.repeats, args.device)


if __name__ == "__main__":
    main()
