"""Listing a checkpoint reads names, dtypes and shapes, never the tensor values."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from inspector import checkpoint_listing
from inspector.__main__ import main

ROOT = Path(__file__).resolve().parent.parent

# VmHWM: this process's peak resident memory (ru_maxrss would carry over pytest's own peak)
_PEAK = """
import json, re, sys
from inspector.__main__ import main
def peak_mib():
    with open("/proc/self/status") as fh:
        return int(re.search(r"VmHWM:\\s+(\\d+) kB", fh.read()).group(1)) // 1024
assert main(["checkpoint", sys.argv[1]]) == 0  # imports and first-call costs
growth = []
for path in sys.argv[2:]:
    before = peak_mib()
    assert main(["checkpoint", path]) == 0
    growth.append(peak_mib() - before)
print(json.dumps(growth))
"""


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak from /proc")
def test_listing_a_64_mib_checkpoint_does_not_load_it(tmp_path):
    save_file({"a": torch.ones(1)}, tmp_path / "small.safetensors")
    big = {"w": torch.zeros(16 * 2**20)}  # 64 MiB of float32
    save_file(big, tmp_path / "big.safetensors")
    torch.save(big, tmp_path / "big.pt")
    del big
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _PEAK,
            str(tmp_path / "small.safetensors"),
            str(tmp_path / "big.safetensors"),
            str(tmp_path / "big.pt"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    growth_mib = json.loads(done.stdout.strip().splitlines()[-1])
    assert all(g < 32 for g in growth_mib), growth_mib  # peak RSS grew by MiB, per file


def test_listing_gives_names_dtypes_and_shapes(tmp_path, capsys):
    state = {"a.weight": torch.ones(2, 3, dtype=torch.bfloat16), "a.bias": torch.zeros(3, dtype=torch.int64)}
    save_file(state, tmp_path / "m.safetensors")
    torch.save({"state_dict": state}, tmp_path / "m.pt")
    expected = [["a.bias", "tensor", "int64", (3,), 3], ["a.weight", "tensor", "bfloat16", (2, 3), 6]]
    table, findings = checkpoint_listing(tmp_path / "m.safetensors")
    assert sorted(table.values.tolist()) == expected and findings == []
    table, findings = checkpoint_listing(tmp_path / "m.pt")
    assert sorted(table.values.tolist()) == expected
    assert [f.code for f in findings] == ["checkpoint-nested"]
    assert main(["checkpoint", str(tmp_path / "m.safetensors")]) == 0
    assert "checkpoint" in capsys.readouterr().out
