"""Shared fixtures: tiny models built fresh for each test; nothing heavy at import."""

from __future__ import annotations

import pytest
import torch

from inspector.aliases import overwrite_on_conversion
from sample_models import get_sample


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def tiny_gpt2():
    return get_sample("tiny-gpt2").build()


@pytest.fixture
def overwrite_flag():
    """Turn on torch's overwrite-on-conversion flag for one test, and back off after."""
    with overwrite_on_conversion(True):
        yield


MID_MODEL = '''
import torch
from torch import nn


def build():
    # 2304 * 2048 + 2048 + 2048 * 4 + 4 = 4,728,836 float32 weights: 18.04 MiB (shown as 18.0 MiB),
    # over the 16 MiB up to which the pages work as soon as they open.
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2304, 2048), nn.ReLU(), nn.Linear(2048, 4))


def example_inputs(batch_size):
    return torch.randn(batch_size, 2304, generator=torch.Generator().manual_seed(1))
'''


@pytest.fixture
def mid_size_model(tmp_path, monkeypatch) -> str:
    """Source of an 18 MiB model in an allowed folder: big enough that pages wait for a button."""
    (tmp_path / "mid.py").write_text(MID_MODEL)
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    return f"{tmp_path / 'mid.py'}:build"


@pytest.fixture(scope="session")
def hf_folders(tmp_path_factory):
    """Tiny GPT-2, BERT, T5, BART, Llama (tied, untied), ViT and BERT2BERT folders, saved once."""
    from hf_folders import save_all

    return save_all(tmp_path_factory.mktemp("hf"))


@pytest.fixture
def world1():
    """A gloo process group of one process (the library's own world of one), destroyed afterwards."""
    from inspector.distributed import process_group

    with process_group("cpu") as (rank, world_size):
        assert (rank, world_size) == (0, 1)
        yield


@pytest.fixture(scope="session")
def world2(tmp_path_factory):
    """Run tests/distributed_worker.py on a world of 2 gloo processes once; (folder, per-rank results).

    The folder holds ``run.jsonl`` (the distributed command, 3 steps), ``planted.jsonl`` (a NaN on
    rank 1 at step 1, a drifted buffer on rank 1 at step 2) and ``dcp/`` (a distributed checkpoint).
    """
    import json

    from distributed_worker import worker
    from ranks import spawn_ranks

    out = tmp_path_factory.mktemp("world2")
    spawn_ranks(worker, 2, str(out))
    return out, [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="session")
def world4(tmp_path_factory):
    """tests/distributed_checks.py's ``mesh_worker`` on 4 gloo processes once: per-rank results."""
    import json

    from distributed_checks import mesh_worker
    from ranks import spawn_ranks

    out = tmp_path_factory.mktemp("world4")
    spawn_ranks(mesh_worker, 4, str(out))
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
# Helpers that multiprocessing and torch keep for the life of the interpreter; they end with it.
_INTERPRETER_HELPERS = ("multiprocessing.resource_tracker", "multiprocessing.forkserver",
                        "torch._inductor.compile_worker")


def _left_behind() -> list:
    import psutil

    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if not any(h in cmdline for h in _INTERPRETER_HELPERS):
            found.append(p)
    return found


@pytest.fixture(scope="session", autouse=True)
def _no_process_left_behind():
    """The suite leaves no process running: a server, worker or shell a test started is gone when
    the tests end (an error at the last test's teardown names any that is not, and stops it)."""
    yield
    import psutil

    _, alive = psutil.wait_procs(_left_behind(), timeout=10)
    if alive:
        names = [f"{p.pid}: {' '.join(p.cmdline())[:200]}" for p in alive if p.is_running()]
        for p in alive:
            p.kill()
        if names:
            pytest.fail("tests left these processes running:\n" + "\n".join(names), pytrace=False)
