"""Every CUDA path of the project in one run (at most a few minutes on one GPU).

    python benchmarks/gpu_check.py            # needs CUDA; prints one line per check
    python benchmarks/gpu_check.py --device cpu   # the same checks on the CPU, as a dry run

Checks: load onto the GPU (with and without a dtype), tie-keeping moves under the
overwrite flag, captures from the GPU into pinned CPU memory equal to the live outputs,
mutation detection on the GPU, a backward pass and gradient norms on the GPU, and a
dispatch of a planned device map across the GPU and the CPU with outputs equal to the
undispatched model. Exits non-zero on the first failed check.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from inspector import capture_activations, gradient_norms, load_model, move_model, plan_device_map  # noqa: E402
from inspector.aliases import overwrite_on_conversion  # noqa: E402
from inspector.offsets import run_backward  # noqa: E402
from inspector.placement import dispatch_plan  # noqa: E402

RESULTS: list[tuple[str, bool, str]] = []


def check(name: str):
    def wrap(fn):
        t0 = time.perf_counter()
        try:
            detail = fn() or ""
            ok = True
        except Exception as exc:  # noqa: BLE001 - report and go on
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        RESULTS.append((name, ok, detail))
        print(
            f"{'PASS' if ok else 'FAIL'}  {name:55s} {time.perf_counter() - t0:6.2f}s  {detail}", flush=True
        )
        return fn
    return wrap


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda:0")
    dev = parser.parse_args().device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device here: nothing to check (use --device cpu for a dry run)")
        return 0
    gpu_index = torch.device(dev).index or 0
    if dev.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name(gpu_index)}, torch {torch.__version__}")

    @check("load tiny-gpt2 on the device, tie kept, 4080 elements")
    def _():
        m = load_model("sample:tiny-gpt2", device=dev).model
        assert m.lm_head.weight is m.transformer.wte.weight
        assert m.lm_head.weight.device.type == torch.device(dev).type
        n = sum(p.numel() for p in m.parameters())
        assert n == 4080, n
        return f"{n} elements"

    @check("move_model to the device in float16 under the overwrite flag")
    def _():
        with overwrite_on_conversion(True):
            m = load_model("sample:tiny-gpt2").model
            plain = load_model("sample:tiny-gpt2").model.to(dev, torch.float16)
            move_model(m, dev, torch.float16)
            assert m.lm_head.weight is m.transformer.wte.weight
            assert m.lm_head.weight.dtype == torch.float16
            return (f"move_model {sum(p.numel() for p in m.parameters())}, "
                    f"plain .to {sum(p.numel() for p in plain.parameters())}")

    @check("captures from the device into pinned CPU memory, mutation named")
    def _():
        loaded = load_model("sample:cnn-bn", device=dev)
        inputs = loaded.example_inputs(4)
        with torch.inference_mode():
            caps = capture_activations(loaded.model, inputs, store_on="cpu")
            conv1 = loaded.model.conv1(inputs)
        out = caps.outputs["conv1"]
        assert out.device.type == "cpu"
        pinned = out.is_pinned() if dev.startswith("cuda") else "n/a"
        assert torch.equal(out, conv1.cpu()), "captured conv1 differs from a fresh conv1 output"
        assert "conv1" in caps.mutated and "bn2" in caps.mutated, caps.mutated
        return f"pinned={pinned}, mutated={sorted(caps.mutated)}"

    @check("backward pass and gradient norms on the device")
    def _():
        loaded = load_model("sample:tiny-gpt2", device=dev)
        run_backward(loaded)
        norms = gradient_norms(loaded.model)
        assert set(norms["state"]) == {"ok"}, norms["state"].value_counts().to_dict()
        return f"{len(norms)} parameters, total {float((norms['norm'] ** 2).sum() ** 0.5):.4f}"

    @check("plan across the device and the CPU, dispatch, outputs equal")
    def _():
        loaded = load_model("sample:split-block", device="cpu")
        key = gpu_index if dev.startswith("cuda") else "cpu"
        budget = {key: 40_000, "cpu": 10**9} if key != "cpu" else {"cpu": 10**9}
        device_map = plan_device_map(loaded.model, budget)
        inputs = loaded.example_inputs(2)
        with torch.no_grad():
            want = loaded.model(inputs)
        with dispatch_plan(loaded.model, device_map) as d, torch.no_grad():
            got = d.model(inputs.to(dev if key != "cpu" else "cpu"))
            devices = sorted({str(x) for x in d.table["device"]})
        torch.testing.assert_close(got.cpu(), want, rtol=1e-5, atol=1e-5)
        return f"devices used: {devices}"

    if dev.startswith("cuda") and torch.cuda.device_count() > 1:
        @check("tie-keeping move between two GPUs")
        def _():
            m = load_model("sample:tiny-gpt2", device="cuda:0").model
            move_model(m, "cuda:1")
            assert m.lm_head.weight is m.transformer.wte.weight
            assert m.lm_head.weight.device == torch.device("cuda:1")

    failed = [name for name, ok, _ in RESULTS if not ok]
    print(f"{len(RESULTS) - len(failed)} of {len(RESULTS)} checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
