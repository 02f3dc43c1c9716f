"""Shared fixtures: tiny models built fresh for each test; nothing heavy at import."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import sys
import threading

import pytest
import torch

from inspector.aliases import overwrite_on_conversion
from sample_models import get_sample


def pytest_collection_modifyitems(config, items):
    _delegate_collectives(items)
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


class _ThisThreadOnly(io.TextIOBase):
    """A text stream that keeps what one thread writes and passes every other thread's writes on."""

    def __init__(self, passthrough) -> None:
        self.owner, self.passthrough, self.kept = threading.get_ident(), passthrough, io.StringIO()

    def write(self, text: str) -> int:
        if threading.get_ident() == self.owner:
            return self.kept.write(text)
        return self.passthrough.write(text)

    def flush(self) -> None:
        self.passthrough.flush()


@pytest.fixture
def run_cli():
    """``run_cli(argv) -> (status, out, err)``: ``inspector.__main__.main(argv)`` in this process,
    keeping only what this thread printed, with the garbage collector paused while it runs. A
    thread left by an earlier test (a browser driver, a server), or a finalizer of an earlier test's
    garbage, cannot write into what the command printed, however the machine schedules them."""
    from inspector.__main__ import main

    def run(argv: list[str]) -> tuple[int, str, str]:
        out, err = _ThisThreadOnly(sys.stdout), _ThisThreadOnly(sys.stderr)
        gc.disable()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                status = main(argv)
        finally:
            gc.enable()
        return status, out.kept.getvalue(), err.kept.getvalue()

    return run


# ----------------------------------------------------------------- tests that start collectives
# A collective's worker threads can deadlock with the interpreter (a C++ join while the GIL is
# held), and no timeout inside a process can end that. So in the pytest process no process group
# may be made: a test that needs one is marked ``collectives`` (or uses ``world1``) and runs whole
# in a child pytest, which this process ends after COLLECTIVES_TIMEOUT seconds, printing every
# thread's stack.
CHILD_ENV = "INSPECTOR_TEST_CHILD"
COLLECTIVES_TIMEOUT = int(os.environ.get("INSPECTOR_TEST_COLLECTIVES_TIMEOUT", "240"))


def pytest_configure(config):
    config.addinivalue_line("markers", "collectives: starts a torch.distributed process group; runs whole in "
                                       f"a child pytest ended after {COLLECTIVES_TIMEOUT} s")
    if os.environ.get(CHILD_ENV):
        return
    import torch.distributed as dist

    init = dist.init_process_group

    def refuse(*args, **kwargs):
        raise RuntimeError("this test starts a process group inside the pytest process; mark it "
                           "@pytest.mark.collectives so that it runs in a child process with a timeout")

    refuse.__wrapped__ = init  # type: ignore[attr-defined]
    dist.init_process_group = refuse


def pytest_unconfigure(config):
    import torch.distributed as dist

    init = getattr(dist.init_process_group, "__wrapped__", None)
    if init is not None:
        dist.init_process_group = init
    fd = getattr(config, "_hard_limit_fd", None)
    if fd is not None:
        os.close(fd)


def _run_in_child(item) -> None:
    """Run ``item`` in a fresh pytest process; fail with its output if it fails or outlives the timeout."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="collectives-") as base:
        cmd = [sys.executable, "-m", "pytest", item.nodeid, "-q", "-p", "no:cacheprovider", "--basetemp",
               os.path.join(base, "t"), "-o", f"timeout={COLLECTIVES_TIMEOUT - 20}"]
        env = {**os.environ, CHILD_ENV: "1"}
        proc = subprocess.Popen(cmd, cwd=item.config.rootpath, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=COLLECTIVES_TIMEOUT)
        except subprocess.TimeoutExpired:
            _dump_and_kill(proc)
            out, _ = proc.communicate()
            pytest.fail(f"{item.nodeid} did not finish in {COLLECTIVES_TIMEOUT} s; every thread's "
                        f"stack:\n{out}", pytrace=False)
    if proc.returncode != 0:
        pytest.fail(f"{item.nodeid} failed in its child process (exit {proc.returncode}):\n{out}",
                    pytrace=False)


def _dump_and_kill(proc) -> None:
    """SIGABRT makes the child's faulthandler print every thread's stack; then the group is killed."""
    import signal
    import time

    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGABRT)
        time.sleep(3)
        os.killpg(proc.pid, signal.SIGKILL)


def _delegate_collectives(items) -> None:
    if os.environ.get(CHILD_ENV):
        return
    for item in items:
        collectives = item.get_closest_marker("collectives") or "world1" in getattr(item, "fixturenames", ())
        if collectives and hasattr(item, "runtest"):
            item.setup = lambda: None  # no fixture of the test is made in this process
            item.runtest = lambda item=item: _run_in_child(item)


# --------------------------------------------------------------- a hard limit on every test
# pytest-timeout's thread method prints every thread's stack and ends the run, but it needs the
# GIL. faulthandler's watchdog is a C thread: it also ends a test stuck in C++ with the GIL held,
# printing every thread's stack to the terminal's stderr (not to the test's captured output).
HARD_LIMIT_GRACE = int(os.environ.get("INSPECTOR_TEST_HARD_GRACE", "60"))


def _terminal_stderr(config) -> int:
    """A file descriptor of the stderr pytest started with, outside its output capture."""
    capman = config.pluginmanager.getplugin("capturemanager")
    with capman.global_and_fixture_disabled() if capman else contextlib.nullcontext():
        try:
            return os.dup(sys.stderr.fileno())
        except (AttributeError, OSError, ValueError):
            # a stderr with no descriptor (a runner that collects the output, as mutmut does): the process's
            return os.dup(2)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    import faulthandler

    marker = item.get_closest_marker("timeout")
    limit = float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout") or 0)
    if limit > 0:
        if not hasattr(item.config, "_hard_limit_fd"):
            item.config._hard_limit_fd = _terminal_stderr(item.config)
        faulthandler.dump_traceback_later(limit + HARD_LIMIT_GRACE, exit=True,
                                          file=item.config._hard_limit_fd)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
