"""A rank that vanishes (killed, out of memory, ``os._exit``) while the others train is named by the rank
waiting for it at its next check-in, within a second, not when the watch's timeout runs out."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch
from ranks import init, spawn_ranks
from torch import nn

TIMEOUT = 300.0  # the default: a vanished rank must be named long before it


def _worker(rank: int, world: int, port: int, out: str) -> None:
    from inspector import watch
    from inspector.distributed import end_group

    torch.set_num_threads(1)
    init(rank, world, port)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    began, said = time.monotonic(), ""
    try:
        with watch(model, opt, Path(out) / "run.inspect", timeout=TIMEOUT):
            for step in range(6):
                if rank == 1 and step == 3:
                    os._exit(0)  # gone without a word: no exception, no end written
                if step == 3:
                    began = time.monotonic()
                model(torch.ones(2, 4) * (step + 1)).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
    except Exception as exc:  # noqa: BLE001 - the test reads what rank 0 was told
        said = f"{type(exc).__name__}: {exc}"
    finally:
        (Path(out) / "said.json").write_text(json.dumps({"said": said, "seconds": time.monotonic() - began}))
        end_group(wait=False)


def test_a_rank_that_vanishes_is_named_at_once_by_the_rank_waiting_for_it(tmp_path):
    from inspector import read_run

    spawn_ranks(_worker, 2, str(tmp_path), timeout=120)
    said = json.loads((tmp_path / "said.json").read_text())
    assert "rank 1 vanished (last seen at step 2 (after 3 training forward pass" in said["said"], said
    assert "while rank 0 waited at training forward pass 4 (at step 3)" in said["said"]
    assert said["seconds"] < 10  # named within a second of waiting (the machine may be loaded), not 300 s
    run = read_run(tmp_path / "run.inspect")
    assert not run.complete
    f = run.failure
    assert f.rank == 1 and f.code == "run-failed" and "on this machine ended without a word" in f.message
    assert sorted(set(run.steps["step"])) == [0, 1, 2]
