"""One process-wide forward hook or one forward hook per module: capture cost, side by side.

Models (one CPU thread, inference mode):
  gpt2-small  the ``gpt2-small`` sample, batch 4 x 128 (the copies dominate)
  llama-deep  the 28-layer, width-64 Llama of ``bench_capture_overhead`` (371 modules, 1 x 16):
              Python work per hook dominates

Variants, each run once per repeat in a rotating order:
  plain         model(x), no hooks
  clone-hooks   a forward hook on every module keeping ``output.detach().clone()`` (registered
                and removed in every repeat), the baseline people write
  global        capture_activations with one process-wide module forward hook (GlobalRecorder
                below: the capture as it was before it hooked each module)
  scoped        capture_activations as it is: one forward hook per module of the model,
                registered and removed in every repeat
  other+global  a forward of a second model while a capture of a one-module model is open
  other+scoped  with the process-wide hook, then with per-module hooks: what a capture costs a
                pass that it does not capture (another session's model)

Figures: medians of paired values (the same repeat), by the wall clock and this process's
CPU time; per-module overhead = (time - plain of the same repeat) / modules. Also the cost of
leaving inference mode around a copy with ``torch._C._InferenceMode`` and with the public
``torch.inference_mode``, and of registering and removing one hook per module.

Run: ``python benchmarks/bench_capture_hooks.py [--repeats 15] [--model llama-deep,gpt2-small]``
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_hook

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _hooks import clone, hooked  # noqa: E402
from bench_capture_overhead import call, deep_llama  # noqa: E402

from inspector.capture import api, capture_activations, capturing  # noqa: E402
from inspector.capture.recorder import Recorder  # noqa: E402
from sample_models import get_sample  # noqa: E402


def gpt2_small() -> tuple[nn.Module, torch.Tensor]:
    sample = get_sample("gpt2-small")
    return sample.build().eval(), sample.example_inputs(4)


class GlobalRecorder(Recorder):
    """The capture with one process-wide module forward hook instead of one hook per module:
    it answers the model's modules through a table; a module with forward hooks of its own
    gets a hook of its own after them (torch runs process-wide hooks first)."""

    def attach(self) -> None:
        table: dict[int, tuple[str, bool]] = {}
        own: dict[int, tuple[str, bool]] = {}
        hooked_modules = []
        for name, module in self.named:
            if id(module) in table or id(module) in own:
                continue
            entry = (name or "(model)", id(module) in self.selected_ids)
            if module._forward_hooks:
                own[id(module)] = entry
                hooked_modules.append(module)
            else:
                table[id(module)] = entry
            if entry[1] and self.options.keep_inputs:
                self.handles.append(
                    module.register_forward_pre_hook(self._pre_hook(entry[0]), with_kwargs=True)
                )
        after = self._hook(own)
        self.handles += [m.register_forward_hook(after, with_kwargs=True) for m in hooked_modules]
        self.handles.append(register_module_forward_hook(self._hook(table), with_kwargs=True))


def with_scope(scoped: bool, run: Callable[[], object]) -> Callable[[], object]:
    """``run`` with the capture's per-module hooks, or with :class:`GlobalRecorder`."""
    def go() -> object:
        api.Recorder = Recorder if scoped else GlobalRecorder
        try:
            return run()
        finally:
            api.Recorder = Recorder
    return go


def other_pass(tiny: nn.Module, other: nn.Module, x) -> object:
    """A forward of ``other`` while a capture of ``tiny`` is open (in this thread: the
    process-wide hook answers it as it answers another thread's pass, it is not captured)."""
    with capturing(tiny) as cap:
        tiny(torch.zeros(1))
        out = call(other, x)
    assert len(cap.order) <= 1, cap.order  # nothing of the other model
    return out


def paired(variants: dict[str, Callable[[], object]], repeats: int) -> dict[str, list[tuple[float, float]]]:
    """(wall, CPU) seconds of every variant in every repeat, after one warm-up call each."""
    times: dict[str, list[tuple[float, float]]] = {n: [] for n in variants}
    names = list(variants)
    for name in names:
        variants[name]()
    for i in range(repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            result = variants[name]()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
            del result
    return times


def bench(label: str, model: nn.Module, x, repeats: int) -> None:
    modules = sum(1 for _ in model.named_modules())
    other, tiny = copy.deepcopy(model), nn.Identity()
    variants = {
        "plain": lambda: call(model, x),
        "clone-hooks": lambda: hooked(model, lambda: call(model, x), clone),
        "global": with_scope(False, lambda: capture_activations(model, x)),
        "scoped": with_scope(True, lambda: capture_activations(model, x)),
        "other+global": with_scope(False, lambda: other_pass(tiny, other, x)),
        "other+scoped": with_scope(True, lambda: other_pass(tiny, other, x)),
    }
    with torch.inference_mode():
        times = paired(variants, repeats)
    print(f"== {label}: {modules} modules, {repeats} paired repeats, {torch.get_num_threads()} thread(s), "
          f"load average {os.getloadavg()[0]:.2f}")
    for k, clock in enumerate(("wall", "CPU")):
        plain = [t[k] for t in times["plain"]]
        over = {}
        print(f"   {clock + ' clock':<14}{'median ms':>10}{'x plain':>9}{'us/module':>11}")
        for name, ts in times.items():
            mine = [t[k] for t in ts]
            over[name] = statistics.median(t - p for t, p in zip(mine, plain, strict=True)) / modules
            ratio = statistics.median(t / p for t, p in zip(mine, plain, strict=True))
            print(
                f"   {name:<14}{statistics.median(mine) * 1e3:>10.2f}{ratio:>9.3f}{over[name] * 1e6:>11.1f}"
            )
        both = statistics.median(s[k] / g[k] for s, g in zip(times["scoped"], times["global"], strict=True))
        others = statistics.median(
            s[k] / g[k] for s, g in zip(times["other+scoped"], times["other+global"], strict=True)
        )
        print(
            f"   {clock}: scoped / global {both:.3f}x; per-module overhead over clone hooks: global "
            f"{over['global'] / over['clone-hooks']:.2f}x, "
            f"scoped {over['scoped'] / over['clone-hooks']:.2f}x; "
            f"another model's pass, scoped / global {others:.3f}x"
        )


def micro(model: nn.Module, repeats: int = 200) -> None:
    """Per call: leaving inference mode for a copy (private and public API), a hook registered
    and removed on every module."""
    t = torch.randn(1, 16, 64)
    mods = [m for _, m in model.named_modules()]
    reused = torch.inference_mode(False)

    def private() -> None:
        with torch._C._InferenceMode(False):
            t.clone()

    def public() -> None:
        with torch.inference_mode(False):
            t.clone()

    def public_reused() -> None:
        with reused:
            t.clone()

    def hooks() -> None:
        for h in [m.register_forward_hook(lambda *a: None, with_kwargs=True) for m in mods]:
            h.remove()

    def per(fn: Callable[[], None], n: int) -> float:
        runs = []
        for _ in range(repeats):
            s = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - s)
        return statistics.median(runs) / n * 1e6

    with torch.inference_mode():
        figures = {"copy in inference mode": per(lambda: t.clone(), 1),
                   "copy outside, torch._C._InferenceMode(False)": per(private, 1),
                   "copy outside, torch.inference_mode(False)": per(public, 1),
                   "copy outside, one torch.inference_mode(False) reused": per(public_reused, 1)}
    figures[f"register + remove a forward hook, per module ({len(mods)})"] = per(hooks, len(mods))
    for name, us in figures.items():
        print(f"   {name:<58}{us:>7.2f} us")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--model", default="llama-deep,gpt2-small")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}")
    for label in args.model.split(","):
        model, x = deep_llama() if label == "llama-deep" else gpt2_small()
        bench(label, model, x, args.repeats)
        if label == "llama-deep":
            micro(model)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
