"""Comparing two checkpoints holds at most about two tensors in memory: a subprocess measures its peak RSS.

The peak is Linux's VmHWM, reset with ``/proc/self/clear_refs`` just before the comparison. The
same process then loads both files whole (safetensors' ``load_file``) as a control: the measure
must see that, or it would prove nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

TENSORS, SIDE = 8, 1024  # 8 tensors of 1024 x 1024 float32: 4 MiB each, 32 MiB a file
MIB = 1 << 20

SCRIPT = r"""
import ctypes, ctypes.util, gc, json, sys
import torch
from safetensors.torch import load_file
from inspector import compare

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

def measure(fn):
    gc.collect()
    # memory freed by the step before goes back to the system, or the next step would reuse it
    # without growing, and the measure would miss it
    ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim(0)
    open("/proc/self/clear_refs", "w").write("5")
    base = status("VmRSS")
    result = fn()
    return status("VmHWM") - base, result

def whole(kind, a, b):
    if kind in ("safetensors", "cast"):  # load_file maps the files: touch every tensor to read its pages
        states = [load_file(a), load_file(b)]
        return states, [float(t.sum()) for s in states for t in s.values()]
    from inspector import read_checkpoint
    return read_checkpoint(a), read_checkpoint(b)

out = {}
for kind, a, b, small_a, small_b in json.loads(sys.argv[1]):
    compare(small_a, small_b)  # imports and first-use allocations happen here, before the measure
    grown, result = measure(lambda: compare(a, b))
    assert result.facts["changed"] == result.facts["compared"] - (kind != "cast"), result.facts
    control, state = measure(lambda: whole(kind, a, b))
    del state
    out[kind] = {"compare": grown, "whole": control}
print(json.dumps(out))
"""


def _write(folder: Path, kind: str, tensors: int, side: int) -> tuple[str, str]:
    gen = torch.Generator().manual_seed(0)
    a = {f"layers.{i}.weight": torch.randn(side, side, generator=gen) for i in range(tensors)}
    b = {k: v + 1 for k, v in a.items()}
    b["layers.0.weight"] = a["layers.0.weight"].clone()  # one unchanged tensor
    if kind == "cast":  # B in bfloat16: every pair is a dtype change, streamed in float32 chunks
        b = {k: v.bfloat16() for k, v in b.items()}
    paths = []
    for name, state in (("a", a), ("b", b)):
        if kind in ("safetensors", "cast"):
            save_file(state, str(folder / f"{name}.safetensors"))
            paths.append(str(folder / f"{name}.safetensors"))
        else:
            import torch.distributed.checkpoint as dcp

            dcp.save(state, checkpoint_id=str(folder / name), no_dist=True)
            paths.append(str(folder / name))
    return paths[0], paths[1]


def test_peak_memory_is_about_two_tensors(tmp_path):
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pytest.skip("this system cannot reset the peak RSS (/proc/self/clear_refs)")
    jobs = []
    for kind in ("safetensors", "dcp", "cast"):  # cast last: its load_file control maps, not allocates
        for size in ("big", "small"):
            (tmp_path / kind / size).mkdir(parents=True)
        jobs.append([kind, *_write(tmp_path / kind / "big", kind, TENSORS, SIDE),
                     *_write(tmp_path / kind / "small", kind, 2, 8)])
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(jobs)], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for kind, grown in json.loads(done.stdout.strip().splitlines()[-1]).items():
        _check(kind, grown)


def _check(kind: str, grown: dict[str, int]) -> None:
    tensor = SIDE * SIDE * 4
    # two whole files are 64 MiB. A safetensors comparison streams both files in 1 MiB chunks (three
    # per side in flight: about 7 MiB measured); a distributed checkpoint's tensor is read whole from
    # its piece, so A's tensor is kept while B's piece bytes and tensor are read (about 16 MiB measured)
    assert grown["whole"] > (1.5 if kind == "cast" else 2) * TENSORS * tensor * 0.9, (kind, grown)
    # a dtype change (B in bfloat16) streams the same way: chunks of both, widened to float32
    assert grown["compare"] < (2 * tensor + 4 * MIB if kind != "dcp" else 4 * tensor + 8 * MIB), (
        kind,
        grown,
    )
