"""``python -m inspector labs collect``: one table of a class from the students' files, checksums verified."""

from __future__ import annotations

import csv
import json

from inspector.__main__ import main
from inspector.labs import TaskRecord, get_lab, grade, lab_report_markdown, record_attempt, results_document

WRONG = {"broken-tie": {"names": ["lm_head.weight"], "code": "tie-broken", "count": 4592},
         "flattening-myths": {"verdict": "true", "changed": 0}}


def _work(lab_id: str, tries: list[str]) -> dict[str, dict[str, TaskRecord]]:
    """A student's progress on the lab's first task: ``tries`` of "wrong" and "right" answers, in order."""
    lab = get_lab(lab_id, labs_dir="")
    task = lab.tasks[0]
    sc = lab.build()
    progress: dict[str, dict[str, TaskRecord]] = {}
    for t in tries:
        answers = task.solution_for(sc) if t == "right" else WRONG[lab_id]
        record_attempt(progress, lab_id, task.id, answers, grade(lab, task.id, sc, answers))
    return progress


def test_three_students_one_tampered(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("INSPECTOR_TEACHER_KEY", "chalk")
    tie = get_lab("broken-tie", labs_dir="")
    myths = get_lab("flattening-myths", labs_dir="")
    ada = results_document([tie, myths], {**_work("broken-tie", ["wrong", "right"]),
                                          **_work("flattening-myths", ["right"])}, "Ada")
    (tmp_path / "ada.json").write_text(json.dumps(ada))
    # Bob hands in his Markdown lab report: the signed results ride along in it
    (tmp_path / "bob.md").write_text(lab_report_markdown(tie, _work("broken-tie", ["wrong", "wrong"]), "Bob"))
    cleo = results_document([tie], _work("broken-tie", ["wrong", "wrong", "wrong"]), "Cleo")
    cleo["labs"]["broken-tie"]["tasks"]["name-group"]["passed"] = True  # edited after the download
    (tmp_path / "cleo.json").write_text(json.dumps(cleo))
    out = tmp_path / "class.csv"

    # Ada hands in her report of the broken tie too, written after her first try: the results file's
    # record (2 attempts) is the one kept
    (tmp_path / "ada.md").write_text(lab_report_markdown(tie, _work("broken-tie", ["wrong"]), "Ada"))
    status = main(["labs", "collect", str(tmp_path / "ada.md"), str(tmp_path / "ada.json"),
                   str(tmp_path / "bob.md"), str(tmp_path / "cleo.json"), "-o", str(out)])
    captured = capsys.readouterr()
    assert status == 1  # one file left out
    assert "cleo.json (Cleo): its checksum does not match" in captured.err
    assert "4 file(s): 3 verified, 1 left out; wrote 3 row(s)" in captured.out
    with out.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["student"], r["lab"], r["task"], r["passed"], r["attempts"], r["file"]) for r in rows] == [
        ("Ada", "broken-tie", "name-group", "True", "2", "ada.json"),
        ("Ada", "flattening-myths", "shares-memory", "True", "1", "ada.json"),
        ("Bob", "broken-tie", "name-group", "False", "2", "bob.md"),
    ]
    assert all(r["time"] for r in rows)

    # without the key the signed files cannot be verified: none is taken
    monkeypatch.delenv("INSPECTOR_TEACHER_KEY")
    assert main(["labs", "collect", str(tmp_path / "ada.json"), "-o", str(out)]) == 1
    assert "signed with a teacher key: set INSPECTOR_TEACHER_KEY" in capsys.readouterr().err
    assert out.read_text().splitlines() == ["student,lab,task,passed,attempts,time,file"]


def test_files_written_without_a_key_carry_a_plain_checksum(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("INSPECTOR_TEACHER_KEY", raising=False)
    doc = results_document([get_lab("broken-tie", labs_dir="")], _work("broken-tie", ["right"]), "Dee")
    assert doc["checksum"]["method"] == "sha256"
    (tmp_path / "dee.json").write_text(json.dumps(doc))
    (tmp_path / "notes.txt").write_text("not results")
    status = main(["labs", "collect", str(tmp_path / "dee.json"), str(tmp_path / "notes.txt"),
                   "-o", str(tmp_path / "class.csv")])
    captured = capsys.readouterr()
    assert status == 1
    assert "notes.txt holds no lab results" in captured.err
    assert "1 with a plain checksum only" in captured.out


def test_labs_list_names_every_lab(capsys):
    assert main(["labs", "list"]) == 0
    out = capsys.readouterr().out
    assert "broken-tie" in out and "The silent block" in out
