"""The Report page: sections to choose, a build button, one download button per format."""

from __future__ import annotations

import os
from pathlib import Path

import torch
from streamlit.testing.v1 import AppTest

from inspector.report import SECTION_TITLES

PAGE = str(Path(__file__).resolve().parent.parent / "pages" / "6_Report.py")


def _labels(at: AppTest) -> list[str]:
    return [b.proto.label for b in at.get("download_button")]


def test_report_page_builds_and_offers_every_format():
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    assert not at.exception
    assert not _labels(at)  # nothing to download before the report is built
    sections = at.multiselect[0]
    assert list(sections.options) == [t for sid, t in SECTION_TITLES.items() if sid != "findings"]
    sections.set_value(["summary"])
    at.button[0].click()  # the form's submit button
    at.run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    labels = _labels(at)
    pdf = ["PDF"] if os.access("/usr/bin/chromium", os.X_OK) else []  # printed only when pressed
    assert [label.split(" ")[0] for label in labels] == ["HTML", "JSON", "Markdown", *pdf]
    preview = "\n".join(m.value for m in at.markdown)
    assert "| parameter elements | 4,080 |" in preview  # tiny-gpt2's unique parameter elements
    assert "## Alias groups" not in preview


def test_report_page_every_section_with_a_budget():
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.run()
    at.text_input(key="report_budget").set_value("0=8KB,cpu=1GB")  # the device budget (tiny-gpt2 is 16 KiB)
    at.button[0].click()
    at.run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Errors"] == "0" and metrics["Sections"] == "7"  # all but the lab results
    assert [w.value.split(":")[0] for w in at.warning] == ["Lab results"]
    preview = "\n".join(m.value for m in at.markdown)
    for title in (
        "## Findings",
        "## Summary",
        "## Alias groups and conversions",
        "## Device map: plan and audit",
        "### Planned device map",
        "## Activation captures",
        "## Attributions",
    ):
        assert title in preview, title
    assert "| mutated | 0 |" in preview  # a count, never an empty cell
    if not torch.cuda.is_available():  # no Module.cuda() error row on a CPU-only server, but a note
        assert "| Module.cuda" not in preview and "left out: the model is not on a CUDA device" in preview


def test_report_page_refuses_a_huge_batch_and_names_its_controls():
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    at.multiselect[0].set_value(["summary", "labs"])
    at.number_input[0].set_value(100000)  # Batch size of the example inputs
    at.button[0].click()
    at.run()
    assert not at.exception
    assert any("100,000 example inputs is too many" in e.value and "**Batch size of the example inputs**"
               in e.value for e in at.error)
    assert "report_request" not in at.session_state  # nothing was built with it
    at.number_input[0].set_value(2)
    at.button[0].click()
    at.run()
    assert not at.error
    # The skipped lab section says what to do on the pages, not which library argument to pass.
    warning = next(w.value for w in at.warning if w.value.startswith("Lab results"))
    assert "Labs page" in warning and "lab=" not in warning


def test_a_report_past_the_servers_wall_budget_says_so_and_the_page_goes_on(monkeypatch):
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    at.multiselect[0].set_value(["summary"])
    monkeypatch.setenv("INSPECTOR_REQUEST_SECONDS", "1e-9")  # the server's budget of one analysis
    at.button[0].click()
    at.run()
    assert not at.exception
    [error] = [e.value for e in at.error]
    assert "stopped after" in error and "ran past its wall budget of 1e-09 s" in error
    assert "INSPECTOR_REQUEST_SECONDS" in error  # what to do
    assert not _labels(at)  # nothing half-made is offered
    monkeypatch.setenv("INSPECTOR_REQUEST_SECONDS", "banana")
    at.button[0].click()
    at.run()
    assert [e.value for e in at.error] == ["INSPECTOR_REQUEST_SECONDS='banana' is not a positive number of "
                                           "seconds: set it to e.g. 600, or unset it for the default"]
    monkeypatch.delenv("INSPECTOR_REQUEST_SECONDS")
    at.button[0].click()  # a stopped analysis cached nothing: built in full now
    at.run()
    assert not at.error, [e.value for e in at.error]
    assert [label.split(" ")[0] for label in _labels(at)][:3] == ["HTML", "JSON", "Markdown"]
