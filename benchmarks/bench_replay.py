"""Seconds to replay one kept gpt2-small training step on the CPU, every module's output captured and
every op checked for NaN/Inf (target <= 5 s), next to the plain step it replays.

The run: ``watch(model, optimizer, path, keep_weights=True)`` over two AdamW steps on a fixed batch of
``--batch`` x ``--seq`` tokens; then ``inspector.replay(path, 1, model=model)`` ``--repeats`` times.

Run: ``python benchmarks/bench_replay.py [--batch 1] [--seq 128] [--repeats 3] [--threads 1]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inspector import replay, watch  # noqa: E402
from sample_models import GPT, GPT2_SMALL, example_tokens, next_token_loss  # noqa: E402

TARGET = 5.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = GPT(GPT2_SMALL)
    tokens = example_tokens(GPT2_SMALL, args.batch, seq_len=args.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def loss_of(outputs: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        return next_token_loss(outputs, inputs)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.inspect"
        plain, plain_cpu = [], []
        with watch(model, opt, path, keep_weights=True) as w:
            for i in range(2):
                t, c = time.perf_counter(), time.process_time()
                loss = loss_of(model(tokens), tokens)
                loss.backward()
                plain.append(time.perf_counter() - t)
                plain_cpu.append(time.process_time() - c)
                w.log(loss=loss)
                if i == 1:  # a healthy run writes no replay file: this step's is asked for
                    w.keeper.finding(_Error(w.steps))
                opt.step()
                opt.zero_grad(set_to_none=True)
        seconds, cpu, reproduced = [], [], []
        for _ in range(args.repeats):
            t, c = time.perf_counter(), time.process_time()
            r = replay(path, 1, model=model, loss=loss_of)
            seconds.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            reproduced.append(r.reproduced)
    print(f"== gpt2-small replay of one step, CPU, {args.batch}x{args.seq} tokens, {torch.get_num_threads()} "
          f"thread(s), torch {torch.__version__}")
    print(f"forward+backward of the step itself: {min(plain):.2f} s wall, {min(plain_cpu):.2f} s CPU")
    wall, used = statistics.median(seconds), statistics.median(cpu)
    print(f"replay (every module captured, every op checked), median over {args.repeats}: {wall:.2f} s wall, "
          f"{used:.2f} s CPU; {len(r.captures.outputs)} module outputs; reproduced: {reproduced}; "
          f"target <= {TARGET:.0f} s: {'met' if used <= TARGET else 'NOT met'} (CPU), "
          f"{'met' if wall <= TARGET else 'NOT met'} (wall)")


class _Error:
    """An error finding at ``step`` as the watch hands one to its keeper."""

    def __init__(self, step: int) -> None:
        self.step, self.code, self.severity = step, "bench", "error"
        self.where, self.message = "", "benchmark"


if __name__ == "__main__":
    main()
