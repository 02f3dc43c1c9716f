"""One lab taken whole in a real browser, wrong then right: hints, locked views, progress that survives
a reload, and the results file the teacher collects."""

from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.e2e

# The silent block: blocks.0 (8416 = 32 + 32 + 4096 + 128 + 4096 + 32 elements) is in no parameter group.
REASON = "it has gradients, but the optimizer does not hold its parameters"


def _choose(page, wait_for_app, label: str, option: str) -> None:
    box = page.get_by_role("combobox", name=label, exact=True)
    box.click()
    if not page.get_by_role("listbox").count():
        box.press("ArrowDown")  # a select box with no value yet opens from the keyboard
    page.get_by_role("option", name=option, exact=True).click()
    wait_for_app(page)


def _type(page, wait_for_app, label: str, text: str) -> None:
    field = page.get_by_label(label, exact=True)
    field.fill(text)
    field.press("Enter")
    wait_for_app(page)


def _check(page, wait_for_app, task: int) -> None:
    page.get_by_role("button", name="Check", exact=True).nth(task - 1).click()
    wait_for_app(page)


def _alerts(page) -> str:
    return "\n".join(page.locator('[data-testid="stAlert"]').all_inner_texts())


def test_the_silent_block_wrong_then_right(app_url, chromium, artifacts, wait_for_app, tmp_path):
    from inspector.labs import read_results

    context = chromium.new_context(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{app_url}/Labs", wait_until="domcontentloaded")
        wait_for_app(page)
        _choose(page, wait_for_app, "Lab", "The silent block")
        page.get_by_role("heading", name="The silent block").wait_for(timeout=60_000)
        main = page.locator('[data-testid="stMain"]')
        page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=30_000)  # the change per tensor
        assert "blocks.0.fc1.weight" in main.text_content()  # a table's cells are in the page's text
        assert "unchanged-tensor" not in main.text_content()  # the compare findings are locked
        assert "Shown once Task 1 is answered right" in main.inner_text()

        # a half-filled answer: no attempt, no hint
        _choose(page, wait_for_app, "Module", "blocks.1")
        _check(page, wait_for_app, 1)
        assert "Answer every field first: Elements that never changed." in _alerts(page)
        assert "Hint 1" not in _alerts(page) and "Attempts:" not in main.inner_text()

        # wrong: blocks.1 moved; one hint, one attempt
        _type(page, wait_for_app, "Elements that never changed", "8416")
        _check(page, wait_for_app, 1)
        assert "Not blocks.1" in _alerts(page) and "Hint 1:" in _alerts(page)
        assert "Attempts: 1" in main.inner_text()

        # right: the locked views open
        _choose(page, wait_for_app, "Module", "blocks.0")
        _check(page, wait_for_app, 1)
        assert "Right: all 8416 elements of blocks.0" in _alerts(page)
        assert "unchanged-tensor" in main.text_content()  # the compare findings open

        # task 2: wrong, then right
        _choose(page, wait_for_app, "Reason", "frozen: its parameters have requires_grad=False")
        _check(page, wait_for_app, 2)
        assert "The evidence says otherwise" in _alerts(page)
        _choose(page, wait_for_app, "Reason", REASON)
        _check(page, wait_for_app, 2)
        page.get_by_text("2 of 2 tasks passed").wait_for(timeout=30_000)
        page.screenshot(path=artifacts / "lab-silent-block-done.png", full_page=True)

        # a reload keeps it all (the address carries the token)
        assert re.search(r"[?&]labs=[A-Za-z0-9_-]{16,}", page.url), page.url
        page.reload(wait_until="domcontentloaded")
        wait_for_app(page)
        page.get_by_text("2 of 2 tasks passed").wait_for(timeout=60_000)

        # the results file: signed with no key here, so a plain checksum, and it verifies
        _type(page, wait_for_app, "Your name (goes into the report)", "Ada")
        with page.expect_download() as download:
            page.get_by_role("button", name=re.compile("^Download my results")).click()
        path = tmp_path / download.value.suggested_filename  # lab-results.json: the uploader wants the suffix
        download.value.save_as(path)
        verified = read_results(open(path, encoding="utf-8").read(), "lab-results.json")
        assert verified.status in ("checksum", "signed") and verified.student == "Ada"
        tasks = verified.labs["silent-block"]["tasks"]
        assert [(t, r["attempts"], r["passed"]) for t, r in tasks.items()] == [("which", 2, True),
                                                                                ("why", 2, True)]
        assert tasks["which"]["passed_answers"]["module"] == "blocks.0"
        assert page.locator('[data-testid="stException"]').count() == 0

        # another browser (after a server restart, say) continues from the file
        other = chromium.new_context(viewport={"width": 1400, "height": 1000})
        fresh = other.new_page()
        fresh.on("pageerror", lambda e: errors.append(str(e)))
        try:
            fresh.goto(f"{app_url}/Labs", wait_until="domcontentloaded")
            wait_for_app(fresh)
            fresh.locator('[data-testid="stFileUploader"] input[type="file"]').set_input_files(path)
            notice = re.compile(r"Continued from .*: 2 task record\(s\) of Ada")
            fresh.get_by_text(notice).wait_for(timeout=60_000)
            _choose(fresh, wait_for_app, "Lab", "The silent block")
            fresh.get_by_text("2 of 2 tasks passed").wait_for(timeout=60_000)
            assert fresh.get_by_role("combobox", name="Module", exact=True).input_value() == "blocks.0"
            assert fresh.get_by_label("Your name (goes into the report)", exact=True).input_value() == "Ada"
        finally:
            other.close()
        assert errors == []
    finally:
        context.close()
