"""The home page's model tree against what people write today, side by side in one run.

``module_tree`` (bytes, devices, dtypes and alias groups per module, badges per tensor) plus the
treemap figure, against the hand-written way: for every module, ``sum(p.numel() *
p.element_size() for p in m.parameters())`` (a walk below every module), then a plain plotly
treemap of those sizes. Measured on ``llama-70b-meta`` (966 modules on the meta device) and
``gpt2-small`` (128 modules, 124 million parameters on the CPU). Target: the tree and its
figure in under 0.5 s on both, at most 3x the hand-written version that knows nothing of ties,
buffers or devices.

Run: ``python benchmarks/bench_tree.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import plotly.graph_objects as go

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _timing import interleaved  # noqa: E402

from inspector import load_model, module_tree  # noqa: E402
from inspector.figures import module_tree_figure  # noqa: E402


def by_hand(model) -> go.Figure:
    """What a notebook does: sizes by walking below every module, then a treemap."""
    ids, parents, values = [], [], []
    for name, m in model.named_modules():
        ids.append("/" + name)
        parents.append("" if not name else "/" + name.rpartition(".")[0])
        values.append(sum(p.numel() * p.element_size() for p in m.parameters()))
    return go.Figure(go.Treemap(ids=ids, parents=parents, values=values, branchvalues="total", maxdepth=3))


def ours(model) -> go.Figure:
    return module_tree_figure(module_tree(model), "device")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for source, device in (("sample:llama-70b-meta", "meta"), ("sample:gpt2-small", "cpu")):
        model = load_model(source, device=device).model
        t = interleaved({"module_tree + figure": lambda m=model: ours(m),
                         "by hand (sizes + treemap)": lambda m=model: by_hand(m)}, args.repeats)
        ratio = t["module_tree + figure"] / t["by hand (sizes + treemap)"]
        modules = sum(1 for _ in model.modules())
        print(
            f"{source} ({modules} modules): module_tree + figure {t['module_tree + figure'] * 1000:.0f} ms, "
            f"by hand {t['by hand (sizes + treemap)'] * 1000:.0f} ms, ratio {ratio:.2f}x"
        )


if __name__ == "__main__":
    main()
