"""What hostile files cost to refuse, next to what the tools people use today spend on them.

Each case runs in a fresh process; the figure is the peak resident memory that process reached
above its own baseline (torch and the inspector imported), and the wall time of the call.

- zip bomb: a torch zip of ``--bomb-mib`` MiB of zeros deflated to a few hundred KiB;
  ``torch.load(weights_only=True)`` next to ``read_checkpoint``.
- DCP index: a ``.metadata`` claiming a (40000, 40000) float32 tensor (6.4 GB) in a piece of
  2**40 bytes; ``read_dcp`` (torch's own ``dcp.load`` needs the 6.4 GB destination tensor first).
- million layers: a GPT-2 folder whose ``config.json`` says ``n_layer: 1000000``;
  ``load_model("hf:...")`` next to building ``--layers`` of those layers on the meta device with
  transformers (``_from_config``), which is what ``from_pretrained`` starts with, scaled to a
  million layers.
- the cost on a healthy folder: the size estimate of a gpt2-small config (12 layers, width 768).

Run: ``python benchmarks/bench_hostile_loading.py [--bomb-mib 512] [--layers 2000]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_CHILD = textwrap.dedent('''
    import json, resource, sys, time
    import torch
    import transformers
    from inspector.loading.checkpoints import read_checkpoint
    from inspector.loading.dcp import read_dcp
    from inspector import load_model
    def rss():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    case, path, layers = sys.argv[1], sys.argv[2], int(sys.argv[3])
    def call():
        if case == "torch.load":
            torch.load(path, weights_only=True)
        elif case == "read_checkpoint":
            read_checkpoint(path)
        elif case == "read_dcp":
            read_dcp(path)
        elif case == "load_model":
            load_model("hf:" + path)
        elif case == "meta-build":
            cfg = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
            cfg.n_layer = layers
            with torch.device("meta"):
                transformers.GPT2LMHeadModel._from_config(cfg)
        elif case == "estimate":
            from inspector.loading.hf_limits import estimate_size
            cfg = transformers.GPT2Config()
            estimate_size(transformers.GPT2LMHeadModel, cfg)
    def timed():
        t0 = time.perf_counter()
        try:
            call()
            outcome = "ok"
        except Exception as exc:
            outcome = type(exc).__name__ + ": " + str(exc)[:70]
        return time.perf_counter() - t0, outcome
    base = rss()
    first, outcome = timed()  # the first call also imports what it needs lazily
    peak = rss() - base
    second = timed()[0] if case not in ("torch.load", "meta-build") else first
    print(json.dumps({"seconds": second, "peak": peak, "outcome": outcome}))
''')


def run(case: str, path: Path | str, layers: int = 0) -> dict:
    done = subprocess.run([sys.executable, "-c", _CHILD, case, str(path), str(layers)], capture_output=True,
                          text=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bomb-mib", type=int, default=512)
    parser.add_argument("--layers", type=int, default=2000)
    args = parser.parse_args()
    from tests.hostile_loading import DCP_EDITS, _dcp_save, _edited, _hf_folder, zip_bomb

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        zip_bomb(root / "bomb.pt", args.bomb_mib)
        import torch

        _dcp_save(root / "dcp-base", {"w": torch.arange(8.0).reshape(4, 2), "b": torch.ones(3)})
        _edited(root / "dcp-base", root / "dcp-huge", DCP_EDITS["huge-piece"])
        big = _hf_folder(root, "million", n_layer=1_000_000)
        rows = [
            (
                "zip bomb",
                f"{(root / 'bomb.pt').stat().st_size / 2**10:.0f} KiB file",
                "torch.load",
                run("torch.load", root / "bomb.pt"),
            ),
            ("zip bomb", "", "read_checkpoint", run("read_checkpoint", root / "bomb.pt")),
            ("DCP (40000, 40000)", "", "read_dcp", run("read_dcp", root / "dcp-huge")),
            (
                "n_layer 1e6",
                "",
                f"transformers meta build of {args.layers} layers",
                run("meta-build", big, args.layers),
            ),
            ("n_layer 1e6", "", "load_model hf:", run("load_model", big)),
            ("gpt2-small config", "", "estimate_size", run("estimate", big)),
        ]
    print(f"{'input':20} {'call':38} {'seconds':>8} {'peak MiB':>9}  outcome")
    for what, note, call, r in rows:
        print(f"{what:20} {call:38} {r['seconds']:8.3f} {r['peak'] / 2**20:9.1f}  {r['outcome'][:60]} {note}")
    meta = rows[3][3]["seconds"]
    print(
        f"\nmillion layers: transformers would spend about {meta * 1e6 / args.layers:,.0f} s building them "
        f"on the meta device alone; load_model refuses in {rows[4][3]['seconds']:.2f} s "
        f"({meta * 1e6 / args.layers / max(rows[4][3]['seconds'], 1e-9):,.0f}x less)"
    )


if __name__ == "__main__":
    main()
