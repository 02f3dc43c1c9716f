"""Cost of the watch with its TensorBoard export on a gpt2-small training step, next to the
tools people reach for today, in one run.

A transformers ``GPT2LMHeadModel`` built from ``GPT2Config()`` (gpt2-small: 12 layers, width 768,
124M parameters, random weights; nothing downloaded) trains with AdamW on the CPU, batch
``--batch`` x ``--seq`` tokens, its loss from ``labels``. Each repeat runs every variant for one
step, in a rotating order, on the same model and optimizer:

  plain             forward, backward, optimizer.step(), zero_grad()
  watch             the step inside ``inspector.watch(model, optimizer, path)``
  watch+tensorboard the step inside ``watch_accelerator(None, model, optimizer, path,
                    export=[TensorBoardExport(writer)])``: every step's global and per-module
                    gradient norms, nonfinite counts and loss go to a ``SummaryWriter`` (flushed)
  DebugUnderflowOverflow  transformers.debug_utils' forward hooks on every module (forward only)
  detect_anomaly    the step under ``torch.autograd.detect_anomaly(check_nan=True)``
  tb add_histogram  ``SummaryWriter.add_histogram`` of every gradient, every step (flushed)
  wandb.watch       ``wandb.watch(model, log="gradients", log_freq=1)`` on an offline run (every
                    W&B folder under the benchmark's temporary folder, nothing contacted), with the
                    ``run.log`` a script makes each step, where wandb is installed (skipped, and said
                    so, where it is not). W&B's own service is a separate process: its share of the
                    work is not in this process's CPU time

Opening and closing each tool is outside the timed step (a once-per-run cost). Ratios are medians
of paired per-repeat ratios against ``plain``, by this process's CPU time (every thread: the
TensorBoard writer's too) and by the wall clock; and, the steadiest on a loaded machine, 1 + the
CPU seconds spent inside the watch's hooks and inside the export over the plain step's. Target:
watch+tensorboard <= 1.05x plain (by the whole step's CPU time or by the time inside).

Run: ``python benchmarks/bench_integrations.py [--repeats 3] [--batch 1] [--seq 128] [--layers 12]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import paired_ratios  # noqa: E402

from inspector import watch  # noqa: E402
from inspector.integrations import TensorBoardExport, WatchedTraining, watch_accelerator  # noqa: E402
from inspector.watching import Watch  # noqa: E402

TARGET = ("watch+tensorboard", 1.05)


@contextmanager
def debug_underflow_overflow(model: torch.nn.Module) -> Any:
    """transformers' DebugUnderflowOverflow keeps no handles: the hooks it adds are removed here."""
    from transformers.debug_utils import DebugUnderflowOverflow

    before = {id(m): set(m._forward_hooks) for m in model.modules()}
    DebugUnderflowOverflow(model)
    try:
        yield
    finally:
        for m in model.modules():
            for key in set(m._forward_hooks) - before[id(m)]:
                del m._forward_hooks[key]


WANDB_FOLDERS = {"WANDB_DIR": "wandb", "WANDB_CACHE_DIR": "wandb-cache", "WANDB_CONFIG_DIR": "wandb-config",
                 "WANDB_DATA_DIR": "wandb-data", "WANDB_ARTIFACT_DIR": "wandb-artifacts"}


@contextmanager
def wandb_offline(folder: Path) -> Any:
    """W&B in offline mode with every folder it writes (run, cache, config, logs) under ``folder``:
    nothing is contacted and nothing is written elsewhere; its service process ends on the way out."""
    import os

    import wandb

    names = [*WANDB_FOLDERS, "WANDB_MODE", "WANDB_SILENT", "WANDB_ERROR_REPORTING"]
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update({k: str(folder / v) for k, v in WANDB_FOLDERS.items()},
                      WANDB_MODE="offline", WANDB_SILENT="true", WANDB_ERROR_REPORTING="false")
    for k in WANDB_FOLDERS:
        Path(os.environ[k]).mkdir(parents=True, exist_ok=True)
    try:
        yield wandb
    finally:
        wandb.teardown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class WandbWatch:
    """``wandb.watch(model, log="gradients", log_freq=1)`` on an offline run; the histograms its hooks
    take during backward are committed by the ``run.log`` a training script makes every step."""

    def __init__(self, wandb: Any, model: torch.nn.Module) -> None:
        self.wandb, self.model, self.run = wandb, model, None

    @contextmanager
    def __call__(self) -> Any:
        self.run = self.wandb.init(project="bench", settings=self.wandb.Settings(
            silent=True, x_disable_stats=True, disable_git=True, save_code=False, console="off"))
        self.run.watch(self.model, log="gradients", log_freq=1)
        try:
            yield
        finally:
            self.run.unwatch(self.model)
            self.run.finish()
            self.run = None

    def after_backward(self, step: int) -> None:
        assert self.run is not None
        self.run.log({"step": step})


class InsideClock:
    """CPU seconds spent inside the watch's hooks and inside the export (the steadiest measure on a
    loaded machine): the methods are wrapped for the run, not changed."""

    PARTS = ((Watch, ("_pre_step", "_post_step", "_forwarded")), (WatchedTraining, ("after_step",)))

    def __init__(self) -> None:
        self.seconds = {"watch": 0.0, "export": 0.0}
        self._saved: list[tuple[type, str, Any]] = []

    def _timed(self, fn: Any, part: str) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            t = time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.process_time() - t
        return wrapper

    def __enter__(self) -> InsideClock:
        for cls, names in self.PARTS:
            for name in names:
                self._saved.append((cls, name, getattr(cls, name)))
                part = "export" if cls is WatchedTraining else "watch"
                setattr(cls, name, self._timed(getattr(cls, name), part))
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, name, fn in reversed(self._saved):
            setattr(cls, name, fn)


def variants(model: torch.nn.Module, opt: torch.optim.Optimizer, folder: Path, writer: Any, wandb: Any,
             ) -> dict[str, tuple[Callable[[], AbstractContextManager[Any]], Callable[[int], None] | None]]:
    """name -> (the context around the step, a call after backward or None)."""
    def histograms(step: int) -> None:
        for name, p in model.named_parameters():
            if p.grad is not None:
                writer.add_histogram(f"grad/{name}", p.grad, step)
        writer.flush()

    out: dict[str, tuple[Callable[[], AbstractContextManager[Any]], Callable[[int], None] | None]] = {
        "plain": (nullcontext, None),
        "watch": (lambda: watch(model, opt, folder / "w.inspect"), None),
        "watch+tensorboard": (lambda: watch_accelerator(None, model, opt, folder / "tb.inspect", report=None,
                                                        export=[TensorBoardExport(writer)]), None),
        "DebugUnderflowOverflow": (lambda: debug_underflow_overflow(model), None),
        "detect_anomaly": (lambda: torch.autograd.detect_anomaly(check_nan=True), None),
        "tb add_histogram": (nullcontext, histograms),
    }
    if wandb is None:
        print("wandb.watch: skipped (wandb is not installed)")
    else:
        ww = WandbWatch(wandb, model)
        out["wandb.watch"] = (ww, ww.after_backward)
    return out


def measure(repeats: int, batch: int, seq: int,
            layers: int) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]]]:
    from torch.utils.tensorboard import SummaryWriter
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=layers))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq))
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as tools:
        try:
            import wandb  # noqa: F401
        except ImportError:
            wandb = None
        else:
            tools.enter_context(wandb_offline(Path(tmp)))
        writer = SummaryWriter(log_dir=str(Path(tmp) / "tb"))
        table = variants(model, opt, Path(tmp), writer, wandb)
        names = list(table)
        wall: dict[str, list[float]] = {n: [] for n in names}
        cpu: dict[str, list[float]] = {n: [] for n in names}
        inside: dict[str, list[float]] = {"watch": [], "export": []}
        for i in range(repeats + 1):  # round 0 warms up
            for n in names[i % len(names):] + names[:i % len(names)]:
                context, after_backward = table[n]
                with InsideClock() as clock, ExitStack() as stack:
                    stack.enter_context(context())
                    clock.seconds = {"watch": 0.0, "export": 0.0}
                    t, c = time.perf_counter(), time.process_time()
                    loss = model(tokens, labels=tokens).loss
                    loss.backward()
                    if after_backward is not None:
                        after_backward(i)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                    if i:
                        wall[n].append(time.perf_counter() - t)
                        cpu[n].append(time.process_time() - c)
                        if n == "watch+tensorboard":
                            for part, sec in clock.seconds.items():
                                inside[part].append(sec)
        writer.close()
    return wall, cpu, inside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    wall, cpu, inside = measure(args.repeats, args.batch, args.seq, args.layers)
    print(f"== transformers GPT2 ({args.layers} layers, width 768) training step (AdamW), CPU, "
          f"{args.batch}x{args.seq} tokens, {args.repeats} repeats, {torch.get_num_threads()} thread(s), "
          f"torch {torch.__version__}")
    rc, rw = paired_ratios(cpu), paired_ratios(wall)
    print(f"{'variant':<24}{'cpu s':>8}{'x plain':>9}{'wall s':>8}{'x plain':>9}")
    for n in cpu:
        print(f"{n:<24}{statistics.median(cpu[n]):>8.3f}{rc[n]:>9.3f}{statistics.median(wall[n]):>8.3f}"
              f"{rw[n]:>9.3f}")
    plain_cpu = statistics.median(cpu["plain"])
    hooks = 1.0 + statistics.median(inside["watch"]) / plain_cpu
    export = statistics.median(inside["export"]) / plain_cpu
    print(f"inside watch+tensorboard: the watch's hooks {hooks:.3f}x, the TensorBoard export +{export:.3f} "
          f"(CPU seconds inside them over the plain step's), {hooks + export:.3f}x together")
    name, target = TARGET
    steady = hooks + export
    verdict = "met" if min(rc[name], steady) <= target else "NOT met"
    print(f"target: {name} <= {target:.2f}x plain: {verdict} (whole step by CPU {rc[name]:.3f}x, "
          f"inside the hooks and export {steady:.3f}x)")
    if verdict != "met":
        sys.exit(1)


if __name__ == "__main__":
    main()
