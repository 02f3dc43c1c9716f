"""A server others reach (``serve --runs``, or an address that is not loopback) without
INSPECTOR_DATA_DIRS reads checkpoints and model folders only under its runs folders and the working
directory, and says so when it starts; a refused path reads the same whether or not it exists."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from streamlit.testing.v1 import AppTest

from inspector.runfolders import data_dirs, data_settings, is_loopback, listen_address
from tests.apptest import PAGES

ROOT = Path(__file__).resolve().parent.parent
CWD = Path("/srv/work")


@pytest.mark.parametrize("extra, env, shared", [
    ([], {}, False),
    (["--server.address", "127.0.0.1"], {}, False),
    (["--server.address=::1"], {}, False),
    (["--server.address", "localhost"], {}, False),
    (["--server.address", "0.0.0.0"], {}, True),
    (["--server.address=192.168.1.5"], {}, True),
    ([], {"STREAMLIT_SERVER_ADDRESS": "0.0.0.0"}, True),
    (["--server.address", "lab.example.org"], {}, True),  # a host name: other machines may reach it
])
def test_an_address_others_reach_confines_the_data_folders(extra, env, shared):
    settings, said = data_settings([], extra, env, CWD)
    assert settings == ({"INSPECTOR_DATA_DIRS": str(CWD.resolve())} if shared else {})
    assert said.startswith("shared server (address ") == shared
    assert is_loopback(listen_address(extra, env)) == (bool(listen_address(extra, env)) and not shared)


def test_runs_folders_confine_to_themselves_and_the_working_directory(tmp_path):
    settings, said = data_settings([tmp_path], [], {}, CWD)
    assert settings == {"INSPECTOR_DATA_DIRS": f"{tmp_path.resolve()},{CWD.resolve()}"}
    assert said == (f"shared server (--runs folders): checkpoints and model folders are read only under "
                    f"{tmp_path.resolve()}, {CWD.resolve()} and uploads; set "
                    "INSPECTOR_DATA_DIRS=DIR[,DIR...] to name the folders, or INSPECTOR_DATA_DIRS='*' to "
                    "open every folder the server can read")


def test_an_explicit_setting_holds(tmp_path):
    for raw, where in ((str(tmp_path), str(tmp_path.resolve())), ("*", "any folder the server can read")):
        settings, said = data_settings([tmp_path], ["--server.address", "0.0.0.0"],
                                       {"INSPECTOR_DATA_DIRS": raw}, CWD)
        assert settings == {}
        assert said.startswith(f"checkpoints and model folders: {where} (INSPECTOR_DATA_DIRS)")
    assert data_dirs("*") is None and data_dirs(str(tmp_path)) == [tmp_path.resolve()]


def _errors(at) -> str:
    return " ".join(e.value for e in at.error)


@pytest.mark.timeout(300)
def test_a_refusal_reads_the_same_whether_the_path_exists_or_not(tmp_path, monkeypatch):
    """Compare's B outside the data folders: /etc/passwd (there) and a path that is not there get one
    message but for the path itself, so the page tells nothing of what is outside."""
    monkeypatch.setenv("INSPECTOR_DATA_DIRS", str(tmp_path))  # what serve sets for a shared server
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "there.pt").write_bytes(b"not a torch file")
    at = AppTest.from_file(str(PAGES / "9_Compare.py"), default_timeout=120).run()
    texts = {}
    for name in ("there.pt", "missing.pt"):
        at.text_input(key="cmp_b").input(str(outside / name)).run()
        assert not at.exception
        texts[name] = _errors(at).replace(name, "NAME")
    assert texts["there.pt"] == texts["missing.pt"] and "not under the data folders" in texts["missing.pt"]
    assert "INSPECTOR_DATA_DIRS=\\*: any folder" in texts["missing.pt"]  # the setting that opens more
    (outside / "there.pt").unlink()
    outside.rmdir()


@pytest.mark.timeout(120)
def test_serve_with_runs_says_so_and_passes_the_folders_on(tmp_path):
    """The real command: the line at start, and the server's environment holding the data folders."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "INSPECTOR_DATA_DIRS"}
    proc = subprocess.Popen([sys.executable, "-m", "inspector", "serve", "--runs", str(tmp_path), "--port",
                             str(port), "--server.address", "127.0.0.1", "--server.headless", "true"],
                            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        line = ""
        while "shared server" not in line and proc.poll() is None:
            line = proc.stderr.readline()
        assert f"read only under {tmp_path.resolve()}, {ROOT}" in line
        deadline = time.monotonic() + 30
        children: list[psutil.Process] = []
        while not children and time.monotonic() < deadline and proc.poll() is None:
            children = psutil.Process(proc.pid).children()
            time.sleep(0.05)
        assert children[0].environ().get("INSPECTOR_DATA_DIRS") == f"{tmp_path.resolve()},{ROOT}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        proc.stderr.close()
