"""The first NaN/Inf producer's inputs and outputs are stored next to the run file, within the
byte budget, and read back by read_run, the report and the Hook captures page."""

from __future__ import annotations

import math

import pytest
import torch
from streamlit.testing.v1 import AppTest
from torch import nn

from inspector import InspectorError, read_run, watch
from inspector.report import watch_report
from inspector.watching import captures_path, read_captures


class Blow(nn.Module):
    """A linear layer whose output turns Inf at step 2 (the producer)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.armed = False

    def forward(self, x):
        y = self.lin(x)
        return y * math.inf if self.armed else y


def _run(path, capture_bytes=64 << 20):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Blow(), nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    xs = torch.randn(4, 2, 4)
    with watch(model, opt, path, nonfinite=True, capture_bytes=capture_bytes) as w:
        for s in range(4):
            model[1].armed = s == 2
            model(xs[s]).pow(2).mean().backward()
            opt.step()
            opt.zero_grad()
    return w, model, xs


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    path = tmp_path_factory.mktemp("caps") / "run.inspect"
    w, model, xs = _run(path)
    return path, w, model, xs


def test_captures_are_stored_and_read_back(stored):
    path, w, model, xs = stored
    assert captures_path(path).is_file()
    caps = read_run(path).captures
    assert caps.order == ["1"] and caps._state["step"] == 2
    # the stored input is what layer 0 gave at step 2 (weights after two SGD steps): finite
    assert (
        torch.equal(caps.inputs["1"], w.result.captures.inputs["1"])
        and torch.isfinite(caps.inputs["1"]).all()
    )
    assert torch.isinf(caps.outputs["1"]).all() and caps.outputs["1"].shape == (2, 3)
    # one module copied once, never watched afterwards: an empty .mutated says nothing
    assert caps.mutated == {} and not caps.mutations_watched and not w.result.captures.mutations_watched
    stats = caps.stats.set_index("kind")
    assert stats.loc["output", "inf"] == 6 and stats.loc["input", "inf"] == 0


def test_report_and_page_show_the_captures(stored, monkeypatch):
    path = stored[0]
    monkeypatch.setenv("INSPECTOR_RUNS", str(path.parent))  # the page opens runs only under the runs folders
    report = watch_report(read_run(path))
    assert [s.id for s in report.sections][-1] == "captures"
    text = report.to_markdown()
    assert "Captures of 1 at step 2" in text and "(2, 3)" in text.replace("\\", "")

    def page(p: str) -> None:
        import streamlit as st

        from ui.run_captures import run_captures_section

        st.session_state.setdefault("cap_run_path", p)
        run_captures_section()

    at = AppTest.from_function(page, args=(str(path),), default_timeout=60).run()
    assert not at.exception and not at.error
    assert any("at step **2**" in m.value for m in at.markdown)
    missing = AppTest.from_function(
        page, args=(str(path.with_name("nope.inspect")),), default_timeout=60
    ).run()
    assert "nope.inspect does not exist" in missing.error[0].value


def test_budget_bounds_the_stored_copies_and_a_new_run_starts_clean(tmp_path):
    path = tmp_path / "run.inspect"
    _run(path, capture_bytes=40)  # room for the 2x4 float32 input (32 bytes), not the 2x3 output (24 more)
    caps = read_captures(path)
    assert caps.total_bytes == 32 and [(s.kind, s.bytes) for s in caps.skipped] == [("output", 24)]
    assert "Left out by the capture byte budget" in watch_report(read_run(path)).to_markdown()
    with watch(nn.Linear(2, 1), None, path, nonfinite=True):  # same path, nothing produced: no stale captures
        pass
    assert read_run(path).captures is None and not captures_path(path).exists()
    with pytest.raises(InspectorError, match="missing.inspect does not exist"):
        read_captures(tmp_path / "missing.inspect")
