"""``model-inspector serve [--port N] [streamlit options]``: start the dashboard."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess

from .. import InspectorError
from ..cli_common import progress
from ..dashboard import streamlit_command

HELP = "start the dashboard (streamlit run app.py); other options, e.g. --server.address 0.0.0.0, go to streamlit"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=None, help="port to serve on (default: 8501)")
    parser.set_defaults(_passthrough=True)  # options this parser does not know go to streamlit


def run(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("streamlit") is None:
        raise InspectorError("the dashboard needs streamlit: pip install 'model-inspector[app]'")
    extra = [a for a in getattr(args, "passthrough", []) if a != "--"]
    command = streamlit_command(args.port, extra)
    progress("starting " + " ".join(command[1:]))
    proc = subprocess.Popen(command)
    try:
        return proc.wait()
    finally:
        if proc.poll() is None:  # interrupted: stop the server before returning
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
