"""The Report page: sections to choose, a build button, one download button per format."""

from __future__ import annotations

import os
from pathlib import Path

from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parent.parent / "pages" / "6_Report.py")


def test_report_page_builds_and_offers_every_format():
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    assert not at.exception
    sections = at.multiselect[0]
    assert "summary" in sections.options[0] or "Summary" in str(sections.options)
    sections.set_value(["summary"])
    at.button[0].click()  # the form's submit button
    at.run()
    assert not at.exception
    assert not at.error, [e.value for e in at.error]
    labels = [b.proto.label for b in at.get("download_button")]
    assert any(label.startswith("HTML") for label in labels)
    assert any(label.startswith("JSON") for label in labels)
    assert any(label.startswith("Markdown") for label in labels)
    if os.access("/usr/bin/chromium", os.X_OK):
        assert any(b.label == "Make PDF" for b in at.button)
    preview = "\n".join(m.value for m in at.markdown)
    assert "4080" in preview  # tiny-gpt2's unique parameter elements
