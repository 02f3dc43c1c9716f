"""Adapter overhead: ``inspector.attribute`` against captum called directly with the same arguments.

Both sides run the same captum class on the same model (eval mode), inputs, target and
options; the direct side wraps the forward the way captum's docs recommend for language
models (``lambda ids: model(ids)[:, -1]``). Repeats are paired and interleaved (the order
flips every repeat); the figure is the median of the per-pair ratios. Target: <= 1.1x.
Times are process CPU time with one torch thread (``--wall`` for wall clock).

    python benchmarks/bench_attribution.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from captum.attr import (
    InputXGradient,
    IntegratedGradients,
    LayerConductance,
    LayerGradCam,
    LayerIntegratedGradients,
    Saliency,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from inspector.attribution import attribute  # noqa: E402
from inspector.loading.models import load_model  # noqa: E402

TARGET_RATIO = 1.1


def time_pair(
    ours, direct, repeats: int, clock=time.process_time, inner: int = 1
) -> tuple[float, float, float]:
    """Median seconds per call of each side and median of the per-pair ratios ours/direct.

    Each sample times ``inner`` calls in a row (for calls of a few milliseconds).

    ``clock`` is CPU time of this process by default: on a shared machine wall time mostly
    measures the neighbours; with one torch thread CPU time is the work done.
    """
    ours(), direct()  # warm up both (captum's lazy imports, allocator)
    t_ours, t_direct, ratios = [], [], []
    for i in range(repeats):
        order = (ours, direct) if i % 2 == 0 else (direct, ours)
        times = {}
        for fn in order:
            t0 = clock()
            for _ in range(inner):
                fn()
            times[fn] = (clock() - t0) / inner
        t_ours.append(times[ours])
        t_direct.append(times[direct])
        ratios.append(times[ours] / times[direct])
    return statistics.median(t_ours), statistics.median(t_direct), statistics.median(ratios)


def cases(quick: bool):
    """(name, pairs, calls per timed sample, ours, direct): the single-pass methods take a few
    ms, so each of their samples times 10 calls in a row."""
    cnn = load_model("sample:cnn-bn")
    x = cnn.example_inputs(8)
    m = cnn.model.eval()  # the adapter runs captum in eval mode; so does the direct side
    layers = dict(m.named_modules())
    n = 16 if quick else 50
    yield ("cnn-bn ig", 5 if quick else 41, 1,
           lambda: attribute(cnn, x, "ig", 3, n_steps=n, return_convergence_delta=True),
           lambda: IntegratedGradients(m).attribute(x, target=3, n_steps=n, return_convergence_delta=True))
    yield ("cnn-bn saliency", 5 if quick else 101, 10,
           lambda: attribute(cnn, x, "saliency", 3),
           lambda: Saliency(m).attribute(x, target=3))
    yield ("cnn-bn input_x_gradient", 5 if quick else 101, 10,
           lambda: attribute(cnn, x, "input_x_gradient", 3),
           lambda: InputXGradient(m).attribute(x, target=3))
    yield (
        "cnn-bn layer_conductance conv2",
        5 if quick else 41,
        1,
        lambda: attribute(cnn, x, "layer_conductance", 3, "conv2", n_steps=n, return_convergence_delta=True),
        lambda: LayerConductance(m, layers["conv2"]).attribute(
            x, target=3, n_steps=n, return_convergence_delta=True
        ),
    )
    yield ("cnn-bn layer_gradcam conv2", 5 if quick else 101, 10,
           lambda: attribute(cnn, x, "layer_gradcam", 3, "conv2"),
           lambda: LayerGradCam(m, layers["conv2"]).attribute(x, target=3))

    tiny = load_model("sample:tiny-gpt2")
    ids = tiny.example_inputs(4)
    tm = tiny.model.eval()
    yield ("tiny-gpt2 layer_ig wte", 5 if quick else 41, 1,
           lambda: attribute(tiny, ids, "layer_ig", 7, n_steps=n, return_convergence_delta=True),
           lambda: LayerIntegratedGradients(lambda t: tm(t)[:, -1], tm.transformer.wte).attribute(
               ids, target=7, n_steps=n, return_convergence_delta=True))

    big = load_model("sample:gpt2-small")
    bids = big.example_inputs(1)[:, :8]  # (1, 8) tokens keep it to seconds on a small CPU
    bm = big.model.eval()
    steps = 4 if quick else 8
    yield (f"gpt2-small layer_ig wte (8 tokens, {steps} steps)", 3 if quick else 7, 1,
           lambda: attribute(big, bids, "layer_ig", 7, n_steps=steps, return_convergence_delta=True),
           lambda: LayerIntegratedGradients(lambda t: bm(t)[:, -1], bm.transformer.wte).attribute(
               bids, target=7, n_steps=steps, return_convergence_delta=True))


def fixed_cost(repeats: int = 2000) -> float:
    """Seconds per call of everything ``attribute`` does besides captum's own work.

    A stand-in captum class that returns at once replaces Saliency for the measurement.
    """
    import dataclasses

    from inspector import attribution

    cnn = load_model("sample:cnn-bn")
    x = cnn.example_inputs(8)
    cnn.model.eval()
    grads = torch.zeros_like(x)

    class Instant:
        def __init__(self, forward_func):
            pass

        def attribute(self, inputs, target=None):
            return grads

    real = attribution.METHODS["saliency"]

    class InstantSpec(type(real)):  # type: ignore[misc]
        @property
        def captum_class(self) -> type:
            return Instant

    attribution.METHODS["saliency"] = InstantSpec(**dataclasses.asdict(real))
    try:
        attribute(cnn, x, "saliency", 3)
        t0 = time.process_time()
        for _ in range(repeats):
            attribute(cnn, x, "saliency", 3)
        return (time.process_time() - t0) / repeats
    finally:
        attribution.METHODS["saliency"] = real


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps and repeats")
    parser.add_argument("--wall", action="store_true", help="time wall clock instead of process CPU time")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads for both sides (default 1: steadier on a shared machine)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    clock = time.perf_counter if args.wall else time.process_time
    print(f"torch {torch.__version__}, {args.threads} CPU thread(s), "
          f"{'wall-clock' if args.wall else 'process CPU'} time")
    print("repeats: pairs; single-pass cases time 10 calls per sample")
    print(f"{'case':40} {'repeats':>7} {'ours ms':>9} {'captum ms':>10} {'diff us':>8} {'ratio':>7}  "
          f"target <= {TARGET_RATIO}x")
    worst = 0.0
    for name, repeats, inner, ours, direct in cases(args.quick):
        t_o, t_d, ratio = time_pair(ours, direct, repeats, clock, inner)
        worst = max(worst, ratio)
        flag = "ok" if ratio <= TARGET_RATIO else "OVER"
        print(f"{name:40} {repeats:7d} {t_o * 1e3:9.2f} {t_d * 1e3:10.2f} {(t_o - t_d) * 1e6:8.0f} "
              f"{ratio:6.3f}x  {flag}", flush=True)
    print(f"adapter fixed cost (captum replaced by a stand-in that returns at once): "
          f"{fixed_cost() * 1e6:.0f} us per call")
    print(f"worst median ratio: {worst:.3f}x ({'meets' if worst <= TARGET_RATIO else 'misses'} "
          f"the {TARGET_RATIO}x target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
