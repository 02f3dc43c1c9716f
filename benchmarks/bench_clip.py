"""What the watch adds to a step that already clips its gradients, next to what the clip adds.

Most teams call ``torch.nn.utils.clip_grad_norm_`` every step: one norm pass over every gradient. The
watch takes per-parameter gradient norms every step too; ``w.clip_grad_norm_`` clips from those, so the
pass is paid once. One model trains with SGD on the CPU (one torch thread), each variant one block of
``--steps`` steps per repeat, in a rotating order, on the same model:

  plain           forward, backward, optimizer.step(), zero_grad()
  clip            the same with torch's clip_grad_norm_ before the step
  watch+clip      the clip step inside ``watch(model, optimizer, path, every=E)``, torch's clip
  watch+w.clip    the same, clipping with ``w.clip_grad_norm_``

Printed, as medians of per-repeat CPU times: the clip's extra time over ``plain``, and the watch's extra
time over ``clip`` with either way of clipping, as a multiple of the clip's extra; then the same from the
medians of each round's differences (paired: steadier on a loaded machine). The issue's target on
``many`` (1,000 tensors): at ``every=1`` the watch's extra at most 1.0x the clip's, at ``every=10`` at
most 0.5x.

Run: ``python benchmarks/bench_clip.py [--model many] [--repeats 15] [--steps 3] [--every 1]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_watch import setup  # noqa: E402
from inspector import watch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("many", "gpt2-mini", "gpt2-small"), default="many")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--every", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, loss_of = setup(args.model, args.batch, 64)
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        blocks = {
            "plain": (lambda: nullcontext(None), None),
            "clip": (lambda: nullcontext(None), "torch"),
            "watch+clip": (lambda: watch(model, opt, folder / "a.inspect", every=args.every), "torch"),
            "watch+w.clip": (lambda: watch(model, opt, folder / "b.inspect", every=args.every), "watch"),
        }
        cpu: dict[str, list[float]] = {n: [] for n in blocks}
        names = list(blocks)

        def steps(w: object, clip: str | None, n: int) -> None:
            for _ in range(n):
                loss_of(model).backward()
                if clip == "torch":
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                elif clip == "watch":
                    w.clip_grad_norm_(1.0)  # type: ignore[attr-defined]
                opt.step()
                opt.zero_grad(set_to_none=True)

        for i in range(args.repeats + 1):
            for n in names[i % len(names):] + names[:i % len(names)]:
                make, clip = blocks[n]
                with make() as w:
                    steps(w, clip, 1)  # the block's first step is not timed
                    c = time.process_time()
                    steps(w, clip, args.steps)
                    if w is not None:  # the rows the run file holds back are written, and timed
                        w.flush()
                    if i:  # the first round warms up
                        cpu[n].append((time.process_time() - c) / args.steps)
    med = {n: statistics.median(v) * 1e3 for n, v in cpu.items()}
    clip_extra = med["clip"] - med["plain"]
    print(f"== {args.model}, SGD, CPU, one thread, every={args.every}, {args.repeats} repeats of "
          f"{args.steps} steps (median CPU ms per step)")
    for n in names:
        print(f"  {n:<14} {med[n]:8.2f} ms")
    print(f"  clip's extra over plain:              {clip_extra:7.2f} ms")
    for n in ("watch+clip", "watch+w.clip"):
        extra = med[n] - med["clip"]
        ratio = extra / clip_extra
        print(f"  {n + ' extra over clip:':<37} {extra:7.2f} ms = {ratio:5.2f}x the clip's extra")
    # paired: each round's differences (the blocks of one round ran back to back), then their medians
    paired_clip = statistics.median(c - p for c, p in zip(cpu["clip"], cpu["plain"], strict=True)) * 1e3
    print(f"  paired, medians of each round's differences: the clip adds {paired_clip:.2f} ms")
    for n in ("watch+clip", "watch+w.clip"):
        extra = statistics.median(w - c for w, c in zip(cpu[n], cpu["clip"], strict=True)) * 1e3
        print(f"  {n + ' adds over clip:':<37} {extra:7.2f} ms = {extra / paired_clip:5.2f}x the clip's")


if __name__ == "__main__":
    main()
