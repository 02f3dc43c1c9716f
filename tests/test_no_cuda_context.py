"""CPU-only work never initialises CUDA, even on a machine that reports GPUs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# torch.cuda is made to report two GPUs; everything that would create a CUDA context or read
# a GPU's memory raises instead. The script then does CPU-only work through the library.
SCRIPT = textwrap.dedent("""
    import torch

    calls = []

    def forbidden(name):
        def fail(*args, **kwargs):
            calls.append(name)
            raise AssertionError(f"CPU-only work called torch.cuda.{name}")
        return fail

    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 2
    for name in ("init", "_lazy_init", "mem_get_info", "get_device_name", "get_device_properties",
                 "synchronize", "set_device", "current_device", "current_stream", "Stream", "Event",
                 "memory_allocated", "max_memory_allocated", "reset_peak_memory_stats", "empty_cache"):
        setattr(torch.cuda, name, forbidden(name))

    from inspector import (build_report, capture_activations, gradient_norms, load_model,
                           offset_map, plan_device_map)
    from inspector.loading.devices import resolve_device
    from inspector.utils.findings import InspectorError
    from inspector.offsets import run_backward

    assert str(resolve_device("cpu")) == "cpu" and str(resolve_device("meta")) == "meta"
    assert str(resolve_device("cuda")) == "cuda:0" and str(resolve_device("cuda:1")) == "cuda:1"
    try:
        resolve_device("cuda:2")
    except InspectorError as exc:
        assert "cuda:0, cuda:1" in str(exc), exc
    else:
        raise AssertionError("cuda:2 was accepted with two GPUs")
    loaded = load_model("sample:cnn-bn", device="cpu")
    cap = capture_activations(loaded.model, loaded.example_inputs(2))
    assert len(cap.stats) == 7
    run_backward(loaded)
    assert set(gradient_norms(loaded.model)["state"]) == {"ok"}
    offset_map(load_model("sample:llama-70b-meta", device="meta").model)
    plan_device_map(loaded.model, {"cpu": 1 << 30})
    build_report(loaded).to_json()
    assert not calls, calls
    assert not torch.cuda.is_initialized()
    print("no CUDA call")
""")


def test_cpu_only_work_never_touches_cuda():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().endswith("no CUDA call")
