"""Names from a model or a checkpoint are data: the dashboard, the reports and the figures show
them as text, never as a link, an image or markup (AppTest; tests/e2e checks a real browser)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from inspector import load_model
from inspector.report import build_report
from tests.hostile_names import IMG, JS, KEY, LINK, live_figure_text, live_markdown, write_hostile_model
from ui.models import Selection

ROOT = Path(__file__).resolve().parent.parent
TEXT_ELEMENTS = ("markdown", "caption", "error", "warning", "info", "success", "subheader", "header",
                 "title")


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hostile-names")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INSPECTOR_MODEL_DIRS", str(folder))
        yield write_hostile_model(folder)


def _shown(at: AppTest) -> list[str]:
    texts = [e.value for kind in TEXT_ELEMENTS for e in getattr(at, kind)]
    return texts + [e.label for e in at.expander]


def _figures(at: AppTest) -> list[dict]:
    return [json.loads(e.proto.spec) for e in at.get("plotly_chart")]


def _run(page: str, hostile) -> AppTest:
    at = AppTest.from_file(str(ROOT / page), default_timeout=120)
    at.session_state["mi_selection"] = Selection(source=hostile[0], checkpoint=hostile[1])
    return at.run()


def test_the_model_really_carries_the_payloads(hostile):
    loaded = load_model(hostile[0], checkpoint=hostile[1])
    names = {n for n, _ in loaded.model.named_modules()}
    assert {LINK, IMG, JS} <= names
    wheres = {f.where for f in loaded.findings}
    assert KEY in wheres and f"{JS}.bias" in wheres


# every page, found as test_pages finds them: a new page is checked without being listed here
PAGES = ["app.py", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "pages").glob("*.py"))]


@pytest.mark.parametrize("page", PAGES)
def test_pages_and_sidebar_show_hostile_names_as_inert_text(page, hostile):
    at = _run(page, hostile)
    assert not at.exception, [e.value for e in at.exception]
    shown = _shown(at)
    if page == "pages/7_Labs.py":  # a lab runs its own model: the picked one is neither loaded nor named
        assert not any(KEY in s or "127.0.0.1:9" in s for s in shown)
    else:
        assert any(KEY in s or "127.0.0.1:9" in s for s in shown)  # the sidebar lists the finding
    for text in shown:
        assert not live_markdown(text), (text, live_markdown(text))
    for fig in _figures(at):
        assert not live_figure_text(fig), live_figure_text(fig)


def test_report_preview_and_markdown_report_keep_names_inert(hostile):
    at = _run("pages/6_Report.py", hostile)
    at.button[0].click()
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    preview = [m.value for m in at.markdown if m.value.startswith("# Model report")]
    assert preview and "hostile" in preview[0]
    for text in _shown(at):
        assert not live_markdown(text), (text, live_markdown(text))


def test_every_report_figure_and_the_markdown_report_are_inert(hostile):
    report = build_report(load_model(hostile[0], checkpoint=hostile[1]), backward=True)
    md = report.to_markdown()
    assert "javascript" in md and not live_markdown(md), live_markdown(md)
    figures = [f.figure for s in report.sections for f in s.figures]
    assert len(figures) >= 4
    assert any(LINK.replace("<", "&lt;").replace(">", "&gt;") in json.dumps(f) for f in figures)
    for fig in figures:
        assert not live_figure_text(fig), live_figure_text(fig)


def test_the_checks_catch_live_markup():
    # the two checkers above must be able to fail
    assert live_markdown(f"finding {KEY}") and live_markdown(f"module {JS}") and live_markdown(LINK)
    assert live_markdown("see http://evil/x") and not live_markdown("`http://evil/x`")
    assert live_figure_text({"data": [{"x": [LINK]}]}) and not live_figure_text({"x": ["a<br>b"]})


def test_a_factory_that_calls_sys_exit_is_an_error_and_the_app_stays_usable(hostile):
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=120).run()
    at.radio(key="mi_kind").set_value("Python file").run()
    at.text_input(key="mi_file").input(hostile[0].replace(":build", ":exits")).run()
    at.button(key="mi_load").click().run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [e.value.replace("\\", "") for e in at.error]  # as it reads: the Markdown escapes gone
    assert any("exits() called sys.exit(0)" in e and "return an nn.Module" in e for e in shown), shown
    assert at.session_state["mi_selection"] == Selection()  # the previous model stays loaded
    assert any(m.label == "Parameter elements" and m.value == "4,080" for m in at.metric)


def _page_that_raises():
    import streamlit as st

    from ui.errors import install_page_handler

    install_page_handler()
    st.write("before the bug")
    raise ZeroDivisionError("[x](javascript:alert(1)) in a message")


def test_an_uncaught_page_error_is_one_escaped_line_with_the_traceback_behind_an_expander():
    at = AppTest.from_function(_page_that_raises, default_timeout=30).run()
    assert [e.value for e in at.error] == [
        "Something went wrong while running this page: ZeroDivisionError: "
        "\\[x\\]\\(javascript:alert\\(1\\)\\) in a message"]
    assert not live_markdown(at.error[0].value)
    assert [x.label for x in at.expander] == ["Traceback (for a bug report)"]
    assert "ZeroDivisionError" in at.expander[0].code[0].value  # the traceback, folded away
    assert at.markdown[0].value == "before the bug"


def test_the_training_page_shows_a_run_of_hostile_modules_as_inert_text(tmp_path, monkeypatch):
    """A watched run of the hostile model (its findings name a hostile module at step 3): the heatmap,
    the timeline, the counts and every text of the Training page show the names as data."""
    import torch

    from inspector import watch
    from tests.apptest import run_page

    model = torch.nn.Sequential()
    for name in (LINK, IMG, JS):
        model.add_module(name, torch.nn.Linear(2, 2))
    path = tmp_path / "run.inspect"
    with watch(model, None, path, explode_factor=10.0) as w:
        for step in range(16):  # steps 12 and 13: one module's gradient x1000 each, LINK then JS
            loss = model(torch.ones(1, 2)).sum()
            loss.backward()
            for name in {12: [LINK], 13: [JS]}.get(step, []):
                for p in getattr(model, name).parameters():
                    p.grad.mul_(1000.0)
            w.log(loss=loss)
            w.step()
            model.zero_grad()
    assert {f.where for f in w.result.findings if f.code == "exploding-gradient"} >= {LINK, JS}
    monkeypatch.setenv("INSPECTOR_RUNS", str(tmp_path))  # the page opens runs from its runs folders only
    at = run_page("8_Training.py", query={"run": str(path)})
    for text in _shown(at):
        assert not live_markdown(text), (text, live_markdown(text))
    figures = _figures(at)
    assert len(figures) >= 2 and any("javascript" in json.dumps(f) for f in figures)
    for fig in figures:
        assert not live_figure_text(fig), live_figure_text(fig)


def test_every_figure_builder_escapes_what_it_draws():
    """Each public function of inspector/figures that builds a plotly figure carries
    ``escaped_figure`` (found by reading every module, so a new builder cannot be left out)."""
    import ast

    import inspector.figures as figures

    builders = []
    for path in sorted((ROOT / "inspector" / "figures").glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            made = {ast.unparse(c.func) for c in ast.walk(node) if isinstance(c, ast.Call)}
            if made & {"go.Figure", "make_subplots"} or any(m.startswith("px.") for m in made):
                builders.append((path.name, node.name, [ast.unparse(d) for d in node.decorator_list]))
    assert len(builders) >= 20
    bare = [(f, n) for f, n, decs in builders if "escaped_figure" not in decs]
    assert not bare, f"decorate these figure builders with @escaped_figure (inspector.utils.escaping): {bare}"
    exported = [n for _, n, _ in builders if n in figures.__all__]
    assert all(hasattr(getattr(figures, n), "__wrapped__") for n in exported), exported
