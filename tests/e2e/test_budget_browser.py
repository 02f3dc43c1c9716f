"""Two browser sessions on one real server: one leaves a long compare, the other still gets its page,
and the server stops the work of the one that left instead of running it to the end for nobody."""

from __future__ import annotations

import os
import re
import time
from urllib.parse import quote

import pytest
import torch
from safetensors.torch import save_file

from tests.e2e.conftest import serve_app

pytestmark = pytest.mark.e2e

TENSORS = 20_000  # a compare of this many small tensors takes seconds on the CPU (7.5 s measured here)
MODEL = f'''
import torch
from torch import nn


def build():
    m = nn.Module()
    m.p = nn.ParameterDict({{f"t{{i}}": nn.Parameter(torch.full((4,), float(i))) for i in range({TENSORS})}})
    return m
'''


def _log_line(log, text: str, timeout: float) -> str | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [ln for ln in log.read_text(errors="replace").splitlines() if text in ln]
        if found:
            return found[0]
        time.sleep(0.2)
    return None


def test_a_session_that_leaves_a_long_compare_stops_it_and_another_gets_its_page(
        chromium, tmp_path, artifacts, wait_for_app):
    (tmp_path / "many.py").write_text(MODEL)
    save_file({f"p.t{i}": torch.full((4,), float(i) + 1) for i in range(TENSORS)},
              str(tmp_path / "b.safetensors"))
    log = artifacts / "streamlit-budget.log"
    env = {**os.environ, "INSPECTOR_MODEL_DIRS": str(tmp_path)}
    with serve_app(log, env=env) as server:
        leaving = chromium.new_context()
        page = leaving.new_page()
        spec, b = f"{tmp_path / 'many.py'}:build", str(tmp_path / "b.safetensors")
        page.goto(f"{server.url}/Compare?model={quote(spec)}&b={quote(b)}", wait_until="domcontentloaded")
        # the sidebar says the model is loaded while the script goes on to the compare
        page.get_by_role("button", name=re.compile(r"Loaded$")).wait_for(timeout=120_000)
        page.wait_for_timeout(1000)
        state = page.locator('[data-testid="stApp"]').first.get_attribute("data-test-script-state")
        assert state == "running"  # the compare is under way
        left = time.monotonic()
        leaving.close()

        staying = chromium.new_context()
        other = staying.new_page()
        other.goto(server.url, wait_until="domcontentloaded")
        wait_for_app(other, timeout=60)  # the other session gets its whole page meanwhile
        other.get_by_role("heading", name="Model Inspector").wait_for(timeout=10_000)
        other.get_by_role("button", name=re.compile(r"Loaded$")).wait_for(timeout=10_000)
        staying.close()

        line = _log_line(log, "the browser session that asked for it has gone", timeout=30)
        assert line is not None, log.read_text()[-3000:]
        assert "compare() stopped after" in line
        assert time.monotonic() - left < 30
    assert "Traceback" not in log.read_text()
