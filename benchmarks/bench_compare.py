"""Comparing two gpt2-small checkpoints with ``compare`` next to reading both files once, side by side.

Two ``.safetensors`` files of GPT-2 small shape (124M parameters, 498 MB of float32 each) are
written to a temporary folder: A from the ``gpt2-small`` sample's random weights, B = A with
small noise added to every tensor but those of block 5 (a fine-tune that left one block alone),
and a rank-8 update on each attention ``c_attn`` weight instead (a merged adapter), so every
changed matrix also goes through the low-rank sketch.
Timed, interleaved, as medians:

- ``read both files``: every byte of both files read once into one reused buffer (the disk-read floor);
- ``load_file + torch diff``: what people write today: ``safetensors.torch.load_file`` of both,
  then ``(b - a).norm() / a.norm()`` and ``(b - a).abs().max()`` per tensor;
- ``inspector compare``: ``compare(A, B)`` (every per-tensor figure, per-module sums, findings).

With ``--cold`` (default) each file's pages are dropped from the page cache before every timed call
(``posix_fadvise(DONTNEED)``, no root needed), so reads come from the disk; ``--warm`` keeps them
cached (then "disk read" is a memory copy). Target: ``compare`` at 0.7x the read speed or better
(read time / compare time >= 0.7). Run: ``python benchmarks/bench_compare.py [--repeats 3] [--warm]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import interleaved  # noqa: E402

TARGET = 0.7


def drop_cache(*paths: str) -> None:
    """Drop the files' clean pages from the page cache, so the next read comes from the disk."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_bytes(*paths: str) -> int:
    buffer = bytearray(16 << 20)
    view = memoryview(buffer)
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as fh:
            while n := fh.readinto(view):
                total += n
    return total


def torch_diff(a: str, b: str) -> dict:
    from safetensors.torch import load_file

    sa, sb = load_file(a), load_file(b)
    out = {}
    for k, ta in sa.items():
        d = sb[k] - ta
        out[k] = (float(d.norm() / ta.norm()), float(d.abs().max()))
    return out


def write_pair(folder: Path) -> tuple[str, str]:
    import torch
    from safetensors.torch import save_file

    from sample_models import SAMPLES

    model = SAMPLES["gpt2-small"].build()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    del model
    a, b = folder / "a.safetensors", folder / "b.safetensors"
    save_file(state, str(a))
    gen = torch.Generator().manual_seed(1)
    for k, v in state.items():
        if k.endswith("attn.c_attn.weight") and ".h.5." not in k:  # a merged rank-8 adapter
            low, high = torch.randn(v.shape[0], 8, generator=gen), torch.randn(8, v.shape[1], generator=gen)
            v.add_(low @ high * 1e-3)
        elif v.is_floating_point() and ".h.5." not in k:
            v.add_(torch.randn(v.shape, generator=gen) * 1e-3)
    save_file(state, str(b))
    return str(a), str(b)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warm", action="store_true", help="keep the files in the page cache")
    args = parser.parse_args()

    from inspector import compare

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        a, b = write_pair(Path(tmp))
        size = os.path.getsize(a) + os.path.getsize(b)

        def timed(fn):
            def call():
                if not args.warm:
                    drop_cache(a, b)
                return fn()
            return call

        result = compare(a, b)
        print(f"compare: {result.facts['summary']}; findings: "
              f"{', '.join(f'{f.code} [{f.where}]' for f in result.findings)}")
        for f in result.findings:
            if f.code == "low-rank-update":
                print(f"  {f.message[:100]}")
        times = interleaved({"read both files": timed(lambda: read_bytes(a, b)),
                             "load_file + torch diff": timed(lambda: torch_diff(a, b)),
                             "inspector compare": timed(lambda: compare(a, b))}, args.repeats)
    floor = times["read both files"]
    print(
        f"two files, {size / 1e9:.2f} GB in all, page cache "
        f"{'kept' if args.warm else 'dropped before each call'}"
    )
    for name, seconds in times.items():
        print(
            f"  {name:24} {seconds:7.3f} s  {size / seconds / 1e9:6.2f} GB/s  read speed "
            f"x{floor / seconds:5.2f}"
        )
    ratio = floor / times["inspector compare"]
    print(
        f"compare at {ratio:.2f}x the read speed (goal >= {TARGET}x): "
        f"{'met' if ratio >= TARGET else 'NOT met'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
