"""Run files with wrong types: refused with the file and line named, never a raw exception or markup."""

from __future__ import annotations

import copy
import json
import re

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

from inspector import Finding, InspectorError
from inspector.__main__ import main
from inspector.distributed import check_step, read_run
from inspector.figures import grad_norm_figure, memory_figure
from inspector.watching import parse_run_bytes
from tests.apptest import run_page


def parse_run(text: str, name: str):
    """The run of an upload holding ``text`` (what the Training page reads)."""
    return parse_run_bytes(text.encode("utf-8"), name)


@pytest.fixture(autouse=True)
def _runs_under_tmp(tmp_path, monkeypatch):
    """The server opens typed run paths only under its runs folders: here, the test's own folder."""
    monkeypatch.setenv("INSPECTOR_RUNS", str(tmp_path))


@pytest.fixture(scope="module")
def record() -> dict:
    """One check_step record of a 2 -> 1 linear layer, in this process (world of 1)."""
    torch.manual_seed(0)
    m = nn.Linear(2, 1)
    m(torch.ones(1, 2)).sum().backward()
    return json.loads(json.dumps(check_step(m, 0, path=None).record))


def _with(record: dict, change) -> str:
    rec = copy.deepcopy(record)
    change(rec)
    return json.dumps(record) + "\n" + json.dumps(rec) + "\n"


HOSTILE = [
    (lambda r: r.update(ranks=5), r"ranks must be a list of objects"),
    (lambda r: r.update({"global": []}), r"global must be an object of numbers"),
    (lambda r: r.update(world_size="x"), r"world_size must be a positive integer, not 'x'"),
    (lambda r: r.update(step="![x](http://h/x.png)"), r"step must be an integer, not '!\[x\]"),
    (lambda r: r.update(step=True), r"step must be an integer, not True"),
    (lambda r: r["ranks"][0].update(rank="<b>0</b>"), r"each rank's \"rank\" must be an integer"),
    (
        lambda r: r["ranks"][0].update(rank=3),
        r"each rank's \"rank\" must be an integer from 0 to world_size - 1, not 3",
    ),
    (lambda r: r["ranks"][0].update(param_bytes="1"), r"rank 0 has a non-numeric param_bytes"),
    (
        lambda r: r.update(tensors=[{"name": 1}]),
        r"tensors must be a list of objects, each with a string name",
    ),
    (
        lambda r: r["tensors"][0].update(nan=1),
        r"tensor 'weight': nan, inf, replica_key and hash must be lists",
    ),
    (
        lambda r: r.update(findings=[{"code": "c", "severity": "info", "where": "", "message": "m", "x": 1}]),
        r"a finding has exactly the keys code, severity, where, message; "
        r"got code, message, severity, where, x",
    ),
    (
        lambda r: r.update(findings=[{"code": 1, "severity": "info", "where": "", "message": "m"}]),
        r"a finding's code, severity, where, message are strings",
    ),
    (
        lambda r: r.update(findings=[{"code": "c", "severity": "fatal", "where": "", "message": "m"}]),
        r"Finding severity must be one of",
    ),
    (lambda r: r.update(backend=["gloo"]), r"backend and note must be strings"),
    (
        lambda r: r["tensors"][0].update(replica_key=["0"]),
        r"tensor 'weight': replica_key must be a list of integers",
    ),
    (
        lambda r: r["tensors"][0].update(replica_key=[0.5]),
        r"tensor 'weight': replica_key must be a list of integers",
    ),
    (
        lambda r: r["tensors"][0].update(hash=[["x", 1]]),
        r"tensor 'weight': hash must be a list of integer lists",
    ),
    (lambda r: r["tensors"][0].update(hash=[7]), r"tensor 'weight': hash must be a list of integer lists"),
    (
        lambda r: r["tensors"][0].update(replica_key=[0], hash=[]),
        r"tensor 'weight': hash has 0 entries for 1 replica keys",
    ),
    (
        lambda r: r["tensors"][0].update(nan=[0, 0, 0]),
        r"tensor 'weight': nan has more entries than world_size \(1\)",
    ),
    (
        lambda r: r["tensors"][0].update(local_grad_norm=["1"]),
        r"tensor 'weight': grad_norm and local_grad_norm must be numbers",
    ),
    (lambda r: r.update(version="2"), r"version must be an integer, not '2'"),
]


@pytest.mark.parametrize("change, message", HOSTILE)
def test_wrong_types_name_the_file_and_line(record, change, message):
    with pytest.raises(
        InspectorError, match=r"run.jsonl line 2 is not a valid check_step record: " + message
    ):
        parse_run(_with(record, change), "run.jsonl")


def test_cli_report_exits_2_on_a_wrongly_typed_run_file(record, tmp_path, capsys):
    path = tmp_path / "run.jsonl"
    path.write_text(_with(record, lambda r: r.update(ranks=5)), encoding="utf-8")
    assert main(["report", str(path), "-o", str(tmp_path / "out")]) == 2
    assert "line 2 is not a valid check_step record" in capsys.readouterr().err


def test_a_valid_record_still_reads(record):
    run = parse_run(_with(record, lambda r: r.update(step=1)), "run.jsonl")
    assert run.steps["step"].tolist() == [0, 1]
    assert run.world_size == 1


def test_page_shows_an_error_not_the_image_a_step_asks_for(record, tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text(_with(record, lambda r: r.update(step="![x](http://h/x.png)")), encoding="utf-8")
    at = run_page("8_Training.py", query={"run": str(path)})
    assert len(at.error) == 1 and "step must be an integer" in at.error[0].value
    assert not [s for s in at.subheader if "Tensors at step" in s.value]


def test_figures_escape_values_from_the_file():
    name = '<a href="http://h">r</a>'
    per_rank = pd.DataFrame({"step": [0], "rank": [name], "grad_norm": [1.0], "param_bytes": [2**20],
                             "grad_bytes": [0], "buffer_bytes": [0], "device_allocated": [None],
                             "device_peak": [None], "rss": [None]})
    steps = pd.DataFrame({"step": [0], "grad_norm": [1.0]})
    norms = grad_norm_figure(per_rank, steps)  # the global norm first, then the ranks
    assert norms.data[1].name == "rank &lt;a href=\"http://h\"&gt;r&lt;/a&gt;"
    assert "<a " not in norms.data[1].hovertemplate
    memory = memory_figure(per_rank, 0)
    assert memory.data[0].name == "rank &lt;a href=\"http://h\"&gt;r&lt;/a&gt;"
    assert "<a " not in memory.data[0].hovertemplate


def test_finding_from_dict_round_trips():
    f = Finding("c", "warning", "w", "m")
    assert Finding.from_dict(f.to_dict()) == f


def _line(record: dict, **changes) -> str:
    rec = copy.deepcopy(record)
    rec.update(changes)
    return json.dumps(rec)


@pytest.mark.parametrize(
    "spelling, message",
    [
        ("NaN", "NaN is not a number a run file holds"),
        ("Infinity", "Infinity is not a number a run file holds"),
        ("-Infinity", "-Infinity is not a number a run file holds"),
        ("1e400", "1e400 is out of range for a float"),
        ("1" + "0" * 400, "the integer 10000000000000000000... has 401 digits, more than a run file holds"),
    ],
)
def test_numbers_json_cannot_hold_are_refused(record, spelling, message):
    text = (
        json.dumps(record) + "\n" + json.dumps(record).replace('"step": 0', f'"step": {spelling}', 1) + "\n"
    )
    with pytest.raises(
        InspectorError, match=r"run.jsonl line 2 is not a valid check_step record: " + re.escape(message)
    ):
        parse_run(text, "run.jsonl")


def test_deeply_nested_brackets_are_refused(record, tmp_path, capsys):
    text = json.dumps(record) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n"
    with pytest.raises(InspectorError, match="run.jsonl line 2 nests brackets too deeply"):
        parse_run(text, "run.jsonl")
    from inspector.placement import load_device_map

    with pytest.raises(InspectorError, match="map.json nests brackets too deeply"):
        load_device_map('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "map.json")


def test_a_newer_version_reads_with_a_warning(record):
    run = parse_run(_line(record, version=999, future={"x": 1}) + "\n", "run.jsonl")
    assert [(f.code, f.severity) for f in run.findings] == [("run-file-newer", "warning")]
    assert "version 999; this one reads version 1" in run.findings[0].message


def test_a_cut_last_line_keeps_every_complete_step(record, tmp_path):
    whole = _line(record) + "\n" + _line(record, step=1) + "\n"
    cut = _line(record, step=2)[:57]
    path = tmp_path / "run.jsonl"
    path.write_text(whole + cut, encoding="utf-8")
    run = read_run(path)
    assert run.steps["step"].tolist() == [0, 1]
    assert [(f.step, f.code) for f in run.findings] == [(1, "run-file-truncated")]
    assert "line 3" in run.findings[0].message and "Read 2 complete steps" in run.findings[0].message
    with pytest.raises(
        InspectorError, match="line 2 is not JSON"
    ):  # a bad line in the middle is still an error
        parse_run(_line(record) + "\n" + cut + "\n" + _line(record, step=1), "run.jsonl")


def test_a_bom_or_a_megabyte_first_line_is_still_a_run_file(record, tmp_path, capsys):
    from inspector.distributed import is_run_file

    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + (_line(record) + "\n").encode())
    many = copy.deepcopy(record)
    many["world_size"] = 5000
    many["ranks"] = [dict(record["ranks"][0], rank=r) for r in range(5000)]
    big = tmp_path / "big.jsonl"
    big.write_text(json.dumps(many) + "\n", encoding="utf-8")
    assert big.stat().st_size > 1_100_000
    assert is_run_file(bom) and is_run_file(big)
    assert read_run(bom).steps["step"].tolist() == [0]
    assert read_run(big).world_size == 5000
    assert (
        main(["report", str(bom), "-o", str(tmp_path / "bom.md")]) == 0
    )  # not "cannot tell what kind of source"
    assert "## Rank 0" in (tmp_path / "bom.md").read_text(encoding="utf-8")


def _long_run_text(record: dict, steps: int = 40, tensors: int = 100) -> str:
    """``steps`` records of ``tensors`` parameters each, as check_step writes them (about 1.8 MB)."""
    lines = []
    for s in range(steps):
        rec = copy.deepcopy(record)
        rec["step"] = s
        rec["tensors"] = [dict(record["tensors"][i % 2], name=f"layers.{i // 2}.{('weight', 'bias')[i % 2]}",
                               grad_norm=0.5 + s + i / 1000) for i in range(tensors)]
        lines.append(json.dumps(rec))
    return "\n".join(lines) + "\n"


def test_a_json_lines_run_is_read_a_line_at_a_time(record, tmp_path):
    """Only the records are kept, never the text, its lines, or the records again as JSON objects: a
    run of 40 records of 100 tensors peaks under 6x its size (3.8x; reading the file whole into a buffer
    of the largest size allowed, then splitting its lines, peaked at 46x)."""
    import tracemalloc

    text = _long_run_text(record)
    path = tmp_path / "run.jsonl"
    path.write_text(text, encoding="utf-8")
    size = path.stat().st_size
    tracemalloc.start()
    run = read_run(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"run.jsonl of {size / 2**20:.2f} MiB: peak {peak / 2**20:.2f} MiB ({peak / size:.1f}x)")
    assert peak < 6 * size
    assert run.steps["step"].tolist() == list(range(40)) and len(run.module_order) == 50
    assert run.matrix()[1][39, 1] == pytest.approx(np.hypot(0.5 + 39 + 2 / 1000, 0.5 + 39 + 3 / 1000))
    assert parse_run(text, "run.jsonl").steps.equals(run.steps)  # an upload reads the same
    names = {id(run.check_run.checks[s].tensors[7].name) for s in range(40)}
    assert len(names) == 1  # one string kept for the name every step repeats


def test_a_line_packing_objects_or_lists_into_few_characters_is_refused_before_it_is_parsed(record, tmp_path):
    """A tensor of check_step takes hundreds of characters; 5,000 tensors of 13 would cost 40 times their
    size once parsed and kept: refused, naming the line, before a line of them is parsed."""
    import tracemalloc

    dense = _line(record, tensors=[{"name": "a"}] * 5000).replace('{"name": "a"}, ', '{"name":"a"},')
    lists = _line(record, tensors=[dict(record["tensors"][0], nan=[[]] * 5000)])
    for bad, what in ((dense, r"packs 5,00\d objects and \d+ lists into"),
                      (lists, r"packs \d objects and 5,0\d\d lists")):
        path = tmp_path / "dense.jsonl"
        path.write_text(json.dumps(record) + "\n" + bad + "\n", encoding="utf-8")
        tracemalloc.start()
        with pytest.raises(InspectorError, match=r"dense.jsonl line 2 " + what):
            read_run(path)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < 2 * len(bad) + 200_000  # the line itself, never its objects
        with pytest.raises(InspectorError, match=r"run.jsonl line 2 " + what):
            parse_run(json.dumps(record) + "\n" + bad + "\n", "run.jsonl")


@pytest.mark.parametrize("newline", ["\r\n", "\r"])
def test_every_line_ending_reads_and_a_line_separator_in_a_name_ends_no_line(record, tmp_path, newline):
    rec = copy.deepcopy(record)
    rec["tensors"][0]["name"] = "layer\u2028x.weight"
    text = newline.join(json.dumps(dict(rec, step=s), ensure_ascii=False) for s in (0, 1)) + newline
    path = tmp_path / "run.jsonl"
    path.write_bytes(text.encode("utf-8"))
    for run in (read_run(path), parse_run(text, "run.jsonl")):
        assert run.steps["step"].tolist() == [0, 1] and run.complete
        assert run.check_run.checks[1].tensors[0].name == "layer\u2028x.weight"
