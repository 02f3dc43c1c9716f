"""Loading a Hugging Face folder through ``hf:`` next to a bare ``from_pretrained``, side by side.

A GPT-2 (width 768, ``--layers`` blocks; 4 blocks: 67.7M parameters, 271 MB of float32)
is saved with ``save_pretrained`` (safetensors) in a temporary folder. Timed, interleaved, as
medians:

- ``from_pretrained``: ``GPT2LMHeadModel.from_pretrained(folder)``, what people call today;
- ``load_model hf:``: the inspector's load (the class from config.json, ``from_pretrained`` with
  its loading report, then every saved tensor checked against the model);
- ``check, loading report``: that check alone (headers; values only where they may differ);
- ``check, every value``: the check without a loading report, reading and comparing every
  saved value (what a load cost before the loading report was used).

Target: ``load_model hf:`` at most 1.3x ``from_pretrained``. Run:
``python benchmarks/bench_hf_load.py [--layers 4] [--repeats 7]``.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import interleaved  # noqa: E402

TARGET = 1.3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    import torch
    import transformers

    from inspector.loading.hf_saved import check_saved
    from inspector.loading.models import load_model

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    logging.getLogger("transformers").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "gpt2"
        torch.manual_seed(0)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=args.layers))
        params = sum(p.numel() for p in model.parameters())
        model.save_pretrained(folder)
        del model
        loaded, report = transformers.GPT2LMHeadModel.from_pretrained(folder, output_loading_info=True)
        with_report, every = check_saved(loaded, folder, report), check_saved(loaded, folder)
        assert with_report == every, "the two checks disagree"
        t = interleaved({
            "from_pretrained": lambda: transformers.GPT2LMHeadModel.from_pretrained(folder),
            "load_model hf:": lambda: load_model(f"hf:{folder}"),
            "check, loading report": lambda: check_saved(loaded, folder, report),
            "check, every value": lambda: check_saved(loaded, folder),
        }, args.repeats, collect=True)
    base = t["from_pretrained"]
    print(f"GPT-2, {args.layers} blocks, {params:,} parameters; median of {args.repeats}")
    print(f"  values read: {with_report.values_read} with the loading report, {every.values_read} without")
    for name, seconds in t.items():
        print(f"  {name:22} {seconds:7.3f} s  {seconds / base:5.2f}x from_pretrained")
    ratio = t["load_model hf:"] / base
    print(f"  load_model hf: / from_pretrained: {ratio:.2f}x (target <= {TARGET}x: "
          f"{'OK' if ratio <= TARGET else 'MISSED'})")
    return 0 if ratio <= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
