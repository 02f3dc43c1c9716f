"""Cost of ``watch`` on a training step, next to the same step without it and under
``torch.autograd.detect_anomaly``, in one run.

One model (random weights) trains with AdamW (``--optimizer sgd``: SGD) on the CPU. ``--model``:

  gpt2-small  124M parameters, 75 modules, batch ``--batch`` x ``--seq`` tokens (the default)
  gpt2-mini   the same code, 4 layers of width 256, vocabulary 8192 (5.3M parameters, 48
              modules): the same shape of work for a loaded machine
  many        1,000 small modules: 500 x (Linear(32, 32), Tanh) in an ``nn.Sequential``,
              batch ``--batch`` x 32 (the cost of the per-module hooks, with little work each)
  mlp         a 32-64-64-1 MLP (ReLU), batch ``--batch`` x 32, mean squared error: a step of well
              under a millisecond, so what is left is the watch's fixed per-step cost (run it with
              ``--optimizer sgd --batch 16 --steps 50``: the target is at most 0.3 ms added per step)

Every repeat runs each variant for one step, in a rotating order, on the same model and
optimizer:

  plain           forward, backward, optimizer.step(), zero_grad()
  watch           the same step inside ``watch(model, optimizer, path)`` (defaults: every
                  step, gradient norms per parameter and module, parameter norms, lr, memory,
                  findings, one Arrow row written and flushed)
  watch+nonfinite the same with ``nonfinite=True`` (forward and backward producers)
  watch+keep      the same with ``keep=True`` (references to the batch, the generators' states, one
                  transfer of the gradient norms before the update; no copy on a healthy step)
  detect_anomaly  the plain step under ``torch.autograd.detect_anomaly()``

The watch block is entered before the timed steps and left after them (opening it, which snapshots
the ties, creates the file and sizes the tracer's buffers, is not a per-step cost); its first step
is not timed, the ``--steps`` after it are (3 by default: the steady state, with the garbage
collector's work on the objects the steps leave behind). Ratios are
medians of paired per-repeat ratios against ``plain`` (the timed steps' rows written to the run file
inside the timing: the steps it holds back, up to half a second's, are flushed before the clock stops),
by the wall clock and by this process's
CPU time (on a shared machine the CPU time is the steadier; with one thread it is the work
done), and, the steadiest, 1 + the CPU time spent inside the watch's own hooks over the plain
step's. The hooks are timed on a second step, in a block of its own, so that the clock calls
around them (thousands on ``many``) are not in the wall and CPU figures.
Targets: watch <= 1.03x, watch+nonfinite <= 1.10x (on ``many``: watch+nonfinite <= 1.5x), watch+keep
<= 1.02x the watch's step (paired against ``watch`` in the same repeats).
Also printed: run file bytes per tensor per step.

Run: ``python benchmarks/bench_watch.py [--model gpt2-small] [--repeats 7] [--batch 1] [--seq 128]
[--threads 1] [--only watch,watch+nonfinite] [--optimizer adamw] [--steps 3]``; the small model's fixed
cost: ``python benchmarks/bench_watch.py --model mlp --optimizer sgd --batch 16 --steps 50 --repeats 15
--only watch``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import paired_ratios  # noqa: E402

from inspector import read_run, watch  # noqa: E402
from inspector.replaying import StepKeeper  # noqa: E402
from inspector.watching import RunWriter, Watch  # noqa: E402
from inspector.watching.tracer import NonfiniteTracer  # noqa: E402
from sample_models import GPT, GPT2_SMALL, example_tokens, next_token_loss  # noqa: E402
from sample_models.gpt import GPTConfig  # noqa: E402

TARGETS = {"watch": 1.03, "watch+nonfinite": 1.10}
MANY_TARGETS = {"watch+nonfinite": 1.5}
GPT2_MINI = GPTConfig(vocab_size=8192, block_size=256, n_layer=4, n_head=4, n_embd=256)


def many_modules() -> torch.nn.Module:
    """1,000 small modules (and the Sequential that holds them)."""
    layers: list[torch.nn.Module] = []
    for _ in range(500):
        layers += [torch.nn.Linear(32, 32), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


Loss = Callable[[torch.nn.Module], torch.Tensor]


def setup(name: str, batch: int, seq: int) -> tuple[torch.nn.Module, Loss]:
    """The model and its loss on a fixed batch."""
    if name == "mlp":
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(batch, 32, generator=g), torch.randn(batch, 1, generator=g)
        mlp = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64),
                                  torch.nn.ReLU(), torch.nn.Linear(64, 1))
        return mlp, lambda m: torch.nn.functional.mse_loss(m(x), y)
    if name == "many":
        x = torch.randn(batch, 32, generator=torch.Generator().manual_seed(0))
        return many_modules(), lambda m: m(x).pow(2).mean()
    config = {"gpt2-small": GPT2_SMALL, "gpt2-mini": GPT2_MINI}[name]
    tokens = example_tokens(config, batch, seq_len=seq)
    return GPT(config), lambda m: next_token_loss(m(tokens), tokens)


def _variants(
    model: torch.nn.Module, opt: torch.optim.Optimizer, folder: Path
) -> dict[str, Callable[[], object]]:
    return {
        "plain": nullcontext,
        "watch": lambda: watch(model, opt, folder / "w.inspect"),
        "watch+nonfinite": lambda: watch(model, opt, folder / "n.inspect", nonfinite=True, capture_bytes=0),
        "watch+keep": lambda: watch(model, opt, folder / "k.inspect", keep=True),
        "detect_anomaly": lambda: torch.autograd.detect_anomaly(check_nan=True),
    }


class HookClock:
    """CPU seconds spent inside the watch's own hooks (a second, steadier measure of its cost):
    the methods are wrapped for the run, not changed."""

    WATCH = ("_pre_step", "_post_step", "_forwarded", "_forward_end")

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
        for cls, names in ((Watch, self.WATCH), (NonfiniteTracer, ("_hook", "_grad", "_node_grad")),
                           (StepKeeper, ("_forward_starts", "weights", "finding", "step_starts"))):
            for name in names:
                self._saved.append((cls, name, getattr(cls, name)))
                setattr(cls, name, self._timed(getattr(cls, name)))
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, name, fn in reversed(self._saved):
            setattr(cls, name, fn)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer,
          loss_of: Callable[[torch.nn.Module], torch.Tensor]) -> None:
    loss = loss_of(model)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def measure(repeats: int, batch: int, seq: int, name: str = "gpt2-small", only: tuple[str, ...] = (),
            steps: int = 3, optimizer: str = "adamw"
            ) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]], float, int]:
    torch.manual_seed(0)
    model, loss_of = setup(name, batch, seq)
    make = torch.optim.SGD if optimizer == "sgd" else torch.optim.AdamW
    opt = make(model.parameters(), lr=1e-5)
    with tempfile.TemporaryDirectory() as tmp:
        variants = _variants(model, opt, Path(tmp))
        if only:
            variants = {n: v for n, v in variants.items() if n == "plain" or n in only}
        names = list(variants)
        wall: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        inside: dict[str, list[float]] = {n: [] for n in names}
        for n in names:  # warm-up
            with variants[n]():
                _step(model, opt, loss_of)
        for i in range(repeats):
            for n in names[i % len(names):] + names[:i % len(names)]:
                with variants[n]() as w:
                    _step(model, opt, loss_of)  # the block's first step: what the watch keeps is built
                    t, c = time.perf_counter(), time.process_time()
                    for _ in range(steps):  # steady state: the collector's work on what steps leave included
                        _step(model, opt, loss_of)
                    if isinstance(w, Watch):  # the rows the run file holds back are written, and timed
                        w.flush()
                    wall[n].append((time.perf_counter() - t) / steps)
                    cpu[n].append((time.process_time() - c) / steps)
                with HookClock() as clock, variants[n]():  # a second step, timed inside the hooks only
                    clock.seconds = 0.0
                    _step(model, opt, loss_of)
                inside[n].append(clock.seconds)
        path = Path(tmp) / ("w.inspect" if "watch" in variants else "n.inspect")
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
    parser.add_argument("--model", choices=("gpt2-small", "gpt2-mini", "many", "mlp"), default="gpt2-small")
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    parser.add_argument("--only", default="", help="comma-separated variants to run beside plain")
    parser.add_argument("--steps", type=int, default=3, help="steps timed in each block, after its first")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    only = tuple(v for v in args.only.split(",") if v)
    wall, cpu, inside, per_tensor, tensors = measure(args.repeats, args.batch, args.seq, args.model, only,
                                                     max(1, args.steps), args.optimizer)
    targets = MANY_TARGETS if args.model == "many" else TARGETS
    small = args.model in ("many", "mlp")
    shape = f"{args.batch}x32 inputs" if small else f"{args.batch}x{args.seq} tokens"
    print(
        f"== {args.model} training step ({'SGD' if args.optimizer == 'sgd' else 'AdamW'}), CPU, {shape}, "
        f"{args.repeats} repeats of {args.steps} steps, "
        f"{torch.get_num_threads()} thread(s), torch {torch.__version__}"
    )
    rw, rc = paired_ratios(wall), paired_ratios(cpu)
    plain_cpu = statistics.median(cpu["plain"])
    print(f"{'variant':<18}{'wall s':>9}{'x plain':>9}{'cpu s':>9}{'x plain':>9}{'in hooks':>10}  target")
    for n in wall:
        target = targets.get(n)
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
    if "watch+keep" in wall and "watch" in wall:
        kw, kc = paired_ratios(wall, "watch")["watch+keep"], paired_ratios(cpu, "watch")["watch+keep"]
        kh = 1.0 + (statistics.median(inside["watch+keep"]) - statistics.median(inside["watch"])) / \
            statistics.median(cpu["watch"])
        print(f"watch+keep against watch: {kw:.3f}x wall, {kc:.3f}x cpu, {kh:.3f}x in hooks  "
              f"target <= 1.02x: "
              f"{'met' if kc <= 1.02 else 'NOT met'} (cpu), {'met' if kh <= 1.02 else 'NOT met'} (in hooks)")
    plain_ms = statistics.median(cpu["plain"]) * 1e3
    for n in wall:  # the fixed per-step cost, paired: each repeat's watched block against its plain one
        if n != "plain":
            added = statistics.median(a - b for a, b in zip(cpu[n], cpu["plain"], strict=True)) * 1e3
            print(f"{n}: adds {added:.3f} ms per step (cpu, paired) to a plain step of {plain_ms:.3f} ms")
    print("in hooks: 1 + CPU seconds inside the watch's own hooks / the plain step's CPU seconds")
    print(f"run file: {per_tensor:.1f} bytes per tensor per step, {tensors} tensors (target <= 32)")


if __name__ == "__main__":
    main()
