"""Cost of ``watch`` on a training step, next to the same step without it and under
``torch.autograd.detect_anomaly``, in one run.

One gpt2-small (124M parameters, random weights) trains with AdamW on the CPU, batch
``--batch`` x ``--seq`` tokens. Every repeat runs each variant for one step, in a rotating
order, on the same model and optimizer:

  plain           forward, backward, optimizer.step(), zero_grad()
  watch           the same step inside ``watch(model, optimizer, path)`` (defaults: every
                  step, gradient norms per parameter and module, parameter norms, lr, memory,
                  findings, one Arrow row written and flushed)
  watch+nonfinite the same with ``nonfinite=True`` (forward and backward producers)
  detect_anomaly  the plain step under ``torch.autograd.detect_anomaly()``

The watch block is entered before and left after the timed step (opening it, which snapshots
the ties and creates the file, is not a per-step cost). Ratios are medians of paired
per-repeat ratios against ``plain``, by the wall clock and by this process's CPU time (on a
shared machine the CPU time is the steadier; with one thread it is the work done), and, the
steadiest, 1 + the CPU time spent inside the watch's own hooks over the plain step's.
Targets: watch <= 1.03x, watch+nonfinite <= 1.10x. Also printed: run file bytes per tensor
per step.

Run: ``python benchmarks/bench_watch.py [--repeats 7] [--batch 1] [--seq 128] [--threads 1]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack, nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import paired_ratios  # noqa: E402

from inspector import read_run, watch  # noqa: E402
from inspector.watching import RunWriter, Watch  # noqa: E402
from inspector.watching.tracer import NonfiniteTracer  # noqa: E402
from sample_models import GPT, GPT2_SMALL, example_tokens, next_token_loss  # noqa: E402

TARGETS = {"watch": 1.03, "watch+nonfinite": 1.10}


def _variants(
    model: torch.nn.Module, opt: torch.optim.Optimizer, folder: Path
) -> dict[str, Callable[[], object]]:
    return {
        "plain": nullcontext,
        "watch": lambda: watch(model, opt, folder / "w.inspect"),
        "watch+nonfinite": lambda: watch(model, opt, folder / "n.inspect", nonfinite=True, capture_bytes=0),
        "detect_anomaly": lambda: torch.autograd.detect_anomaly(check_nan=True),
    }


class HookClock:
    """CPU seconds spent inside the watch's own hooks (a second, steadier measure of its cost):
    the methods are wrapped for the run, not changed."""

    WATCH = ("_pre_step", "_post_step", "_forward_start", "_forward_end")

    def __init__(self) -> None:
        self.seconds = 0.0
        self._saved: list[tuple[type, str, object]] = []

    def _timed(self, fn):  # noqa: ANN001, ANN202 - a plain wrapper
        def wrapper(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            t = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.process_time() - t
        return wrapper

    def __enter__(self) -> HookClock:
        for cls, names in ((Watch, self.WATCH), (NonfiniteTracer, ("_hook",))):
            for name in names:
                self._saved.append((cls, name, getattr(cls, name)))
                setattr(cls, name, self._timed(getattr(cls, name)))
        grad_hook = NonfiniteTracer._grad_hook
        self._saved.append((NonfiniteTracer, "_grad_hook", grad_hook))
        NonfiniteTracer._grad_hook = lambda tracer, call, kind: self._timed(grad_hook(tracer, call, kind))
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, name, fn in reversed(self._saved):
            setattr(cls, name, fn)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, tokens: torch.Tensor) -> None:
    loss = next_token_loss(model(tokens), tokens)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def measure(repeats: int, batch: int, seq: int) -> tuple[dict[str, list[float]], dict[str, list[float]],
                                                         dict[str, list[float]], float, int]:
    torch.manual_seed(0)
    model = GPT(GPT2_SMALL)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = example_tokens(GPT2_SMALL, batch, seq_len=seq)
    with tempfile.TemporaryDirectory() as tmp:
        variants = _variants(model, opt, Path(tmp))
        names = list(variants)
        wall: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        inside: dict[str, list[float]] = {n: [] for n in names}
        for n in names:  # warm-up
            with variants[n]():
                _step(model, opt, tokens)
        for i in range(repeats):
            for n in names[i % len(names):] + names[:i % len(names)]:
                with HookClock() as clock, ExitStack() as stack:
                    stack.enter_context(variants[n]())
                    clock.seconds = 0.0
                    t, c = time.perf_counter(), time.process_time()
                    _step(model, opt, tokens)
                    wall[n].append(time.perf_counter() - t)
                    cpu[n].append(time.process_time() - c)
                    inside[n].append(clock.seconds)
        path = Path(tmp) / "w.inspect"
        run = read_run(path)
        with RunWriter(Path(tmp) / "header.inspect", run.meta):  # the schema and metadata, written once
            pass
        per_step = os.path.getsize(path) - os.path.getsize(Path(tmp) / "header.inspect")
        per_tensor = per_step / len(run.steps) / len(run.meta.parameters)
    return wall, cpu, inside, per_tensor, len(run.meta.parameters)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    wall, cpu, inside, per_tensor, tensors = measure(args.repeats, args.batch, args.seq)
    print(
        f"== gpt2-small training step (AdamW), CPU, {args.batch}x{args.seq} tokens, {args.repeats} repeats, "
        f"{torch.get_num_threads()} thread(s), torch {torch.__version__}"
    )
    rw, rc = paired_ratios(wall), paired_ratios(cpu)
    plain_cpu = statistics.median(cpu["plain"])
    print(f"{'variant':<18}{'wall s':>9}{'x plain':>9}{'cpu s':>9}{'x plain':>9}{'in hooks':>10}  target")
    for n in wall:
        target = TARGETS.get(n)
        hooks = 1.0 + statistics.median(inside[n]) / plain_cpu
        verdict = (
            ""
            if target is None
            else (
                f"<= {target:.2f}x: {'met' if rc[n] <= target else 'NOT met'} (cpu), "
                f"{'met' if hooks <= target else 'NOT met'} (in hooks)"
            )
        )
        print(f"{n:<18}{statistics.median(wall[n]):>9.3f}{rw[n]:>9.3f}{statistics.median(cpu[n]):>9.3f}"
              f"{rc[n]:>9.3f}{hooks:>9.3f}x  {verdict}")
    print("in hooks: 1 + CPU seconds inside the watch's own hooks / the plain step's CPU seconds")
    print(f"run file: {per_tensor:.1f} bytes per tensor per step, {tensors} tensors (target <= 32)")


if __name__ == "__main__":
    main()
