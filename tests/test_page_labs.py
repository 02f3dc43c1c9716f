"""The Labs page: one lab end to end, a broken teacher lab file, and the teacher view."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parent.parent / "pages" / "7_Labs.py")


def _page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.run()
    assert not at.exception
    return at


def test_complete_the_shifted_offsets_lab(monkeypatch):
    monkeypatch.delenv("INSPECTOR_LABS_DIR", raising=False)
    monkeypatch.delenv("INSPECTOR_TEACHER_KEY", raising=False)
    at = _page()
    at.selectbox(key="lab_pick").set_value("shifted-offsets").run()
    assert not at.exception
    assert at.header[0].value == "The shifted offsets"

    # an empty answer is no attempt: no hint, nothing recorded
    at.button(key="lab_check_shifted-offsets_locate").click().run()
    assert any("Give an answer first" in w.value for w in at.warning)
    assert not any(i.value.startswith("Hint") for i in at.info) and not any(
        "Attempts" in c.value for c in at.caption
    )

    # a wrong answer first: the full map's reading of index 100; feedback and the first hint
    at.selectbox(key="lab_shifted-offsets_locate_parameter").set_value("layers.0.base.weight")
    at.text_input(key="lab_shifted-offsets_locate_element").input("(12, 4)")
    at.button(key="lab_check_shifted-offsets_locate").click().run()
    assert not at.exception
    assert any("full map says" in e.value for e in at.error)
    assert any(i.value.startswith("Hint 1:") for i in at.info)

    # trainable-only vector: layers.1.lora_B.weight holds [80, 112); 100 - 80 = 20 -> (10, 0)
    at.selectbox(key="lab_shifted-offsets_locate_parameter").set_value("layers.1.lora_B.weight")
    at.text_input(key="lab_shifted-offsets_locate_element").input("(10, 0)")
    at.button(key="lab_check_shifted-offsets_locate").click().run()
    # its full-map start 496 minus 80: the 416 frozen elements in front of it
    at.text_input(key="lab_shifted-offsets_shift_shift").input("416")
    at.selectbox(key="lab_shifted-offsets_shift_reason").set_value(
        "frozen parameters come before it in parameters(), so the full map counts them")
    at.button(key="lab_check_shifted-offsets_shift").click().run()
    assert not at.exception
    assert [s.value.split(":")[0] for s in at.success] == ["Right", "Right"]
    assert not at.error
    assert "2 of 2 tasks passed" in at.get("progress")[0].proto.text
    assert any(":green[:material/check_circle:] The shifted offsets (2/2)" in c.value for c in at.caption)

    # the lab report: Markdown right away, the report module's HTML on request
    at.text_input(key="lab_student").input("Ada").run()
    assert len(at.get("download_button")) == 1
    at.button(key="lab_html_btn_shifted-offsets").click().run()
    assert not at.exception
    assert len(at.get("download_button")) == 2


def test_a_broken_lab_file_does_not_break_the_page(tmp_path, monkeypatch):
    (tmp_path / "typo.py").write_text("from inspector.labs import Lab\nLAB = Lab(\n")
    monkeypatch.setenv("INSPECTOR_LABS_DIR", str(tmp_path))
    at = _page()
    assert any("Lab 'typo' could not be loaded" in e.value for e in at.error)
    from inspector.labs import discover_labs

    assert len(at.selectbox(key="lab_pick").options) == len(discover_labs(labs_dir=""))  # the built-in labs


def test_teacher_view_needs_the_key(monkeypatch):
    monkeypatch.delenv("INSPECTOR_LABS_DIR", raising=False)
    monkeypatch.setenv("INSPECTOR_TEACHER_KEY", "chalk")
    at = _page()
    at.selectbox(key="lab_pick").set_value("flattening-myths").run()
    at.text_input(key="lab_teacher_key").input("wrong").run()
    assert any(e.value == "That is not the teacher key." for e in at.error)
    assert not at.json
    at.text_input(key="lab_teacher_key").input("chalk").run()
    assert not at.exception
    assert [j.value for j in at.json][:2] == ['{"verdict": "false"}', '{"verdict": "false", "elements": 636}']


def test_every_package_lab_renders_with_its_views(monkeypatch):
    monkeypatch.delenv("INSPECTOR_LABS_DIR", raising=False)
    at = _page()
    for lab_id in ["broken-tie", "shifted-offsets", "stranded-buffer", "corrupted-capture",
                   "flattening-myths", "find-the-op", "late-overflow", "silent-block"]:
        at.selectbox(key="lab_pick").set_value(lab_id).run()
        assert not at.exception, lab_id
        assert not [w.value for w in at.warning if "not available" in w.value], lab_id
        # experiments and other on-demand views run when asked
        for key in [b.key for b in at.button if (b.key or "").startswith(f"lab_run_{lab_id}_")]:
            at.button(key=key).click().run()
            assert not at.exception, (lab_id, key)
            assert not [w.value for w in at.warning if "not available" in w.value], (lab_id, key)
    # broken-tie's alias graphs and stranded-buffer's treemap are plotly charts
    at.selectbox(key="lab_pick").set_value("stranded-buffer").run()
    assert len(at.get("plotly_chart")) == 1


def test_a_failing_teacher_checker_is_reported_not_raised(tmp_path, monkeypatch):
    (tmp_path / "oops.py").write_text(
        "from inspector.labs import Field, Lab, Scenario, Task\n"
        "from inspector import load_model\n"
        "def check(scenario, answers):\n"
        "    return 1 / 0\n"
        "LAB = Lab('oops', 'Oops', 'A checker with a bug.', lambda: Scenario(load_model('sample:cnn-bn')),\n"
        "          (Task('t', 'Say anything.', (Field('a', 'Answer'),), check),))\n")
    monkeypatch.setenv("INSPECTOR_LABS_DIR", str(tmp_path))
    at = _page()
    at.selectbox(key="lab_pick").set_value("oops").run()
    at.text_input(key="lab_oops_t_a").input("hello")
    at.button(key="lab_check_oops_t").click().run()
    assert not at.exception
    assert [e.value for e in at.error] == [
        "The checker of this task failed: ZeroDivisionError: division by zero"]


def test_the_late_overflow_findings_stay_hidden_until_the_producer_is_found(monkeypatch):
    monkeypatch.delenv("INSPECTOR_LABS_DIR", raising=False)
    at = _page()
    at.selectbox(key="lab_pick").set_value("late-overflow").run()
    assert not at.exception

    def tables():
        return [d.value for d in at.dataframe if "where" in d.value.columns or "module" in d.value.columns]

    assert tables() == []  # neither the findings nor the producer's captures name the answer yet
    assert sum("Shown once Task 1 is answered right" in c.value for c in at.caption) == 2
    assert len(at.selectbox(key="lab_late-overflow_fix_fix").options) == 3
    at.selectbox(key="lab_late-overflow_producer_module").set_value("inp")
    at.text_input(key="lab_late-overflow_producer_step").input("10")
    at.button(key="lab_check_late-overflow_producer").click().run()
    assert any("inp is not where the NaN/Inf was produced (it runs upstream" in e.value for e in at.error)
    assert tables() == []  # a wrong answer shows nothing more
    at.selectbox(key="lab_late-overflow_producer_module").set_value("gate")
    at.button(key="lab_check_late-overflow_producer").click().run()
    assert any(s.value.startswith("Right: gate") for s in at.success)
    assert "gate" in set(tables()[0]["where"])  # now the findings show
