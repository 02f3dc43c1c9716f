"""``model-inspector serve [--port N] [streamlit options]``: start the dashboard.

A shared server (``--runs``, or a ``--server.address`` that is not loopback) without
``INSPECTOR_DATA_DIRS`` reads checkpoints and model folders only under its runs folders and the working
directory, and says so at start (:func:`inspector.runfolders.data_settings`);
``INSPECTOR_DATA_DIRS=DIR[,DIR...]`` names the folders, ``INSPECTOR_DATA_DIRS=*`` opens every folder the
server can read.

The streamlit server runs as a child process that never outlives this one: a SIGTERM or
SIGHUP sent to ``serve`` (``docker stop``, systemd, a test's ``terminate()``) is passed on to
the server and ``serve`` returns once it has stopped; on Linux the kernel also stops the
server if ``serve`` itself is killed outright (SIGKILL).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .. import InspectorError
from ..dashboard import streamlit_command
from ..runfolders import RUNS_ENV, data_settings, runs_dirs
from ..utils import install_hint
from .argtypes import port
from .common import progress

HELP = (
    "start the dashboard (streamlit run app.py); other options, e.g. --server.address 0.0.0.0, "
    "go to streamlit"
)

_FORWARDED = tuple(getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=port, default=None, help="port to serve on, 1..65535 (default: 8501)")
    parser.add_argument("--runs", default=None, metavar="DIR[,DIR...]",
                        help="folders whose run files the Training and Compare pages list, and the only "
                             "places a typed run path may point to (default: $INSPECTOR_RUNS)")
    parser.set_defaults(_passthrough=True)  # options this parser does not know go to streamlit


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("streamlit") is None:
        raise InspectorError(f"the dashboard needs streamlit: {install_hint('app')}")
    extra = [a for a in getattr(args, "passthrough", []) if a != "--"]
    env = dict(os.environ)
    runs = runs_dirs(getattr(args, "runs", None), check=True)
    if runs:
        env[RUNS_ENV] = ",".join(str(d) for d in runs)
        progress("runs folders: " + ", ".join(str(d) for d in runs))
    settings, said = data_settings(runs, extra, env, Path.cwd())
    env.update(settings)
    progress(said)
    command = streamlit_command(args.port, extra)
    progress("starting " + " ".join(command[1:]))
    proc = subprocess.Popen(command, env=env,
                            preexec_fn=_stop_with_parent if sys.platform == "linux" else None)
    try:
        with _forwarding(proc):
            return proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: stop the server before returning
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _stop_with_parent() -> None:
    """In the child, before streamlit starts: the kernel sends it SIGTERM when ``serve`` dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@contextmanager
def _forwarding(proc: subprocess.Popen) -> Iterator[None]:
    """Pass SIGTERM and SIGHUP on to ``proc`` while the block runs (main thread only: elsewhere
    Python cannot take signals, and the caller's own handling stays as it is)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum: int, frame: Any) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
