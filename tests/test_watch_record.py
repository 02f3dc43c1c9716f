"""The run file: typed schema, round trip, growth, truncation, size, check_step's rows and version 1 files."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from inspector import InspectorError
from inspector.watching import (
    RunMeta,
    RunWriter,
    StepRecord,
    parse_run_bytes,
    read_run,
    record_batch,
    schema,
    synthetic_run,
)


def _meta(modules: int = 3) -> RunMeta:
    names = tuple(f"m{i}" for i in range(modules))
    return RunMeta("tiny", 1, 1, names, tuple(f"{n}.weight" for n in names), tuple(range(modules)))


def _record(step: int, modules: int = 3, **kw) -> StepRecord:
    norms = np.arange(modules, dtype=np.float32) + step  # module i at step s: i + s
    return StepRecord(step=step, rank=0, time=100.0 + step, loss=1.0 / (step + 1), lr=[0.1, 0.01],
                      module_grad_norm=norms, module_nonfinite=np.zeros(modules, np.int32),
                      param_grad_norm=norms, **kw)


def test_schema_is_the_record_type():
    assert schema().names == [f.name for f in dataclasses.fields(StepRecord)]


def test_round_trip_names_every_column(tmp_path):
    path = tmp_path / "r.inspect"
    finding = {"code": "dead-gradient", "severity": "warning", "where": "m1", "message": "zero"}
    with RunWriter(path, _meta()) as w:
        w.write([_record(0, scalar_names=["acc"], scalar_values=[0.5])])
        w.write([_record(1, findings=[finding], module_param_norm=np.ones(3, np.float32))])
    run = read_run(path)
    assert run.complete and run.module_order == ("m0", "m1", "m2")
    assert run.steps["step"].tolist() == [0, 1]
    assert run.steps["lr_1"].tolist() == [0.01, 0.01]
    assert run.steps["acc"].iloc[0] == 0.5 and np.isnan(run.steps["acc"].iloc[1])
    assert [(f.step, f.rank, f.code, f.where) for f in run.findings] == [(1, 0, "dead-gradient", "m1")]
    steps, grid = run.matrix("grad_norm")
    assert steps.tolist() == [0, 1] and grid.tolist() == [[0, 1, 2], [1, 2, 3]]
    assert np.isnan(run.matrix("param_norm")[1][0]).all()  # not taken at step 0
    m = run.modules
    assert len(m) == 6 and m.loc[(m.step == 1) & (m.module == "m2"), "grad_norm"].item() == 3.0
    assert run.at(1)["param_norm"].tolist() == [1.0, 1.0, 1.0]
    assert parse_run_bytes(path.read_bytes()).steps["step"].tolist() == [0, 1]


def test_readable_while_written_and_after_a_cut_mid_batch(tmp_path):
    path = tmp_path / "r.inspect"
    w = RunWriter(path, _meta())
    for s in range(5):
        w.write([_record(s)])
    grown = read_run(path)  # no end-of-stream marker yet
    assert not grown.complete and grown.steps["step"].tolist() == [0, 1, 2, 3, 4]
    w.write([_record(5)])
    size = path.stat().st_size
    w.close()
    data = path.read_bytes()
    for cut in (size - 1, size - 40, size - 200):  # the writer died inside step 5
        cutfile = tmp_path / f"cut{cut}.inspect"
        cutfile.write_bytes(data[:cut])
        run = read_run(cutfile)
        assert run.steps["step"].tolist() == [0, 1, 2, 3, 4] and not run.complete


def test_the_one_stream_reader_reads_a_growing_file_on_from_where_it_stopped(tmp_path):
    """read_stream, which read_run, read_check_run and RunFollower share: whole batches up to a cut one,
    ``end`` just past the last whole one, and from there, with the schema, the rest."""
    import pyarrow as pa

    from inspector.runfiles import END_OF_STREAM, read_stream

    path = tmp_path / "r.inspect"
    w = RunWriter(path, _meta())
    w.write([_record(0)])
    w.write([_record(1)])
    two = path.stat().st_size
    w.write([_record(2)])
    data = path.read_bytes()
    first = read_stream(pa.BufferReader(data[:two + 10]))  # step 2 cut after 10 of its bytes
    assert [b.column("step").to_pylist() for b in first.batches] == [[0], [1]]
    assert first.cut and not first.closed and first.end == two and first.meta == _meta()
    header = read_stream(pa.BufferReader(data), header_only=True)
    assert header.batches == [] and not header.cut and header.meta == _meta() and 0 < header.end < two
    w.close()
    data = path.read_bytes()
    assert data[-8:] == END_OF_STREAM
    rest = read_stream(pa.BufferReader(data[two:]), first.schema)
    assert [b.column("step").to_pylist() for b in rest.batches] == [[2]]
    assert rest.closed and not rest.cut and rest.end == len(data) - two - len(END_OF_STREAM)
    with pytest.raises(pa.ArrowInvalid):
        read_stream(pa.BufferReader(b""))


def test_bytes_per_tensor_per_step(tmp_path):
    path = tmp_path / "big.inspect"
    synthetic_run(path, steps=200, modules=500, chunk=1)  # one batch per step, as watch writes
    per = path.stat().st_size / (200 * 500)
    assert per <= 32, per  # about 20 bytes: 16 per module + 4 per parameter, + framing


def test_not_a_run_file(tmp_path):
    bad = tmp_path / "x.inspect"
    bad.write_bytes(b"hello")
    with pytest.raises(InspectorError, match="x.inspect"):
        read_run(bad)
    with pytest.raises(InspectorError, match="does not exist"):
        read_run(tmp_path / "missing.inspect")


def test_reads_check_steps_run_file(tmp_path):
    """check_step writes the watch's Arrow run file (its records in the check column), read by the one
    read_run."""
    import torch

    from inspector.distributed import check_step

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    path = tmp_path / "run.inspect"
    for step in range(2):
        model(torch.ones(1, 2)).sum().backward()
        last = check_step(model, step, path)
    run = read_run(path)
    assert run.module_order == ("0", "1") and run.steps["step"].tolist() == [0, 1]
    assert run.meta.world_size == 1 and run.complete
    rec = last.record
    direct = {t["name"]: t["grad_norm"] for t in rec["tensors"]}
    expected = np.hypot(direct["0.weight"], direct["0.bias"])
    assert run.matrix()[1][1, 0] == pytest.approx(expected, rel=1e-6)
    assert run.kind == "check"
    assert run.totals["grad_norm"].iloc[-1] == pytest.approx(rec["global"]["grad_norm"])
    assert run.check_run is not None and run.check_run.steps.equals(run.totals)


def test_one_reader_and_one_report_for_both_kinds_of_run_file(tmp_path):
    """inspector.distributed.read_run is inspector.read_run; a check_step file and a watch file both read
    through it as a Run, and both render with run_report."""
    import torch

    import inspector
    import inspector.distributed
    from inspector import Run, run_report, watch
    from inspector.distributed import check_step

    assert inspector.distributed.read_run is inspector.read_run is read_run
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    checked, watched = tmp_path / "check.inspect", tmp_path / "watch.inspect"
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with watch(model, opt, watched):
        for step in range(2):
            model(torch.ones(1, 2)).sum().backward()
            check_step(model, step, checked)
            opt.step()
            opt.zero_grad()
    runs = {"check": inspector.distributed.read_run(checked), "watch": inspector.read_run(watched)}
    assert {kind: (type(run), run.kind) for kind, run in runs.items()} == {
        "check": (Run, "check"), "watch": (Run, "watch")}
    for run in runs.values():  # the tables both kinds share: one row per (step, rank), the same modules
        assert run.steps[["step", "rank"]].values.tolist() == [[0, 0], [1, 0]]
        assert run.module_order == ("0", "1")
    # check_step's detail: 4 tensors (two weights, two biases) in one process, no process group
    check = runs["check"]
    assert (check.world_size, check.backend) == (1, "none")
    assert check.tensors["name"].tolist() == ["0.weight", "0.bias", "1.weight", "1.bias"]
    assert check.per_rank[["step", "rank"]].values.tolist() == [[0, 0], [1, 0]]
    assert check.totals["step"].tolist() == [0, 1]
    with pytest.raises(InspectorError, match="watch.inspect is a watched run: tensors is what "
                                             "inspector.distributed.check_step records"):
        _ = runs["watch"].tensors
    sections = {kind: [s.id for s in run_report(run).sections] for kind, run in runs.items()}
    assert sections["check"] == ["findings", "run", "rank-0", "tensors"]
    assert sections["watch"][:3] == ["findings", "run", "modules"]
    assert [s.id for s in run_report(checked).sections] == sections["check"]


@pytest.mark.parametrize("change", [{"world_size": 0}, {"modules": [1, 2]}, {"parameter_modules": [0, 0, 7]},
                                    {"version": 999}, {"format": "other"}, {"every": "1"}])
def test_bad_metadata_is_refused_by_name(tmp_path, change):
    import pyarrow as pa

    from inspector.watching import META_KEY

    meta = json.loads(_meta().to_json()) | change
    path = tmp_path / "bad.inspect"
    with open(path, "wb") as fh, pa.ipc.new_stream(fh, schema().with_metadata({META_KEY: json.dumps(meta)})):
        pass
    with pytest.raises(InspectorError, match="bad.inspect"):
        read_run(path)


@pytest.fixture(scope="module")
def two_rank_lines() -> list[str]:
    """Two check_step records of ``0: Linear(2, 1)`` as a world of 2 would write them: each rank's
    local gradient norm half the global one, and a ``nan`` list one entry short."""
    import copy

    import torch

    from inspector.distributed import check_step

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(2, 1))
    model(torch.ones(1, 2)).sum().backward()
    one = json.loads(json.dumps(check_step(model, 0, path=None).record))
    lines = []
    for step in range(2):
        rec = copy.deepcopy(one)
        rec["step"], rec["world_size"] = step, 2
        rec["ranks"] = [rec["ranks"][0], {**rec["ranks"][0], "rank": 1}]
        for t in rec["tensors"]:
            t["local_grad_norm"] = [t["grad_norm"] / 2] * 2
            t["nan"], t["inf"] = [0], [0, 0]
        lines.append(json.dumps(rec))
    return lines


def test_a_two_rank_check_step_file_reads_with_global_module_norms(two_rank_lines):
    rec = json.loads(two_rank_lines[0])
    run = parse_run_bytes(("\n".join(two_rank_lines) + "\n").encode(), "run.jsonl")
    assert run.complete and run.check_run is not None and run.check_run.world_size == 2
    direct = {t["name"]: t["grad_norm"] for t in rec["tensors"]}
    expected = np.hypot(direct["0.weight"], direct["0.bias"])
    for rank in (0, 1):  # the global norm, as a watch file stores it, not this rank's half
        assert run.matrix("grad_norm", rank)[1][0, 0] == pytest.approx(expected, rel=1e-6)
        assert run.matrix("nonfinite", rank)[1][0, 0] == 0


def test_a_cut_check_step_file_is_incomplete_and_says_so(two_rank_lines):
    text = two_rank_lines[0] + "\n" + two_rank_lines[1][:40]
    run = parse_run_bytes(text.encode(), "run.jsonl")
    assert not run.complete and run.steps["step"].unique().tolist() == [0]
    assert [f.code for f in run.findings] == ["run-file-truncated"]


def test_one_step_table_has_the_numbers_taken_at_that_step(tmp_path):
    path = tmp_path / "every2.inspect"
    synthetic_run(path, steps=4, modules=3, every=2, world_size=2)
    run = read_run(path)
    taken, skipped = run.at(2, rank=1), run.at(3, rank=1)
    assert list(taken.columns) == ["module", "grad_norm", "param_norm", "nonfinite"]
    assert list(skipped.columns) == [
        "module",
        "grad_norm",
        "nonfinite",
    ]  # parameter norms are taken every 2 steps
    assert taken["grad_norm"].tolist() == pytest.approx(run.matrix("grad_norm", 1)[1][2].tolist())
    with pytest.raises(InspectorError, match="no step 9 for rank 1"):
        run.at(9, rank=1)


def test_a_finding_is_once_per_code_place_and_rank(tmp_path):
    """The same finding on rank 0 at steps 1 and 3 and on rank 1 at step 2: each rank's kept at its first
    step (``dead-gradient`` is a code that fires once; one that recurs is in test_watch_episodes.py)."""
    from inspector import Finding
    from inspector.watching import first_findings

    f = Finding("dead-gradient", "warning", "layers.1", "no gradient").to_dict()
    path = tmp_path / "two.inspect"
    with RunWriter(path, dataclasses.replace(_meta(), world_size=2)) as w:
        for step in range(4):
            w.write([_record(step, findings=[f] if step in (1, 3) else []),
                     dataclasses.replace(_record(step, findings=[f] if step == 2 else []), rank=1)])
    found = first_findings(read_run(path))
    assert [(s.step, s.rank, s.code) for s in found] == [
        (1, 0, "dead-gradient"),
        (2, 1, "dead-gradient"),
    ]


def test_a_version_1_file_without_the_check_column_still_reads(tmp_path):
    """Version 1 (before check_step wrote this format) had no check column and no kind: it reads as a
    watch run, every check null."""
    import pyarrow as pa

    from inspector.watching import META_KEY, record_batch

    meta = dataclasses.replace(_meta(), version=1)
    raw = json.loads(meta.to_json())
    del raw["kind"]
    old = pa.schema([f for f in schema() if f.name not in ("check", "finding_ranks")]).with_metadata(
        {META_KEY: json.dumps(raw).encode()})
    batch = record_batch([_record(0), _record(1)])
    path = tmp_path / "v1.inspect"
    with open(path, "wb") as fh, pa.ipc.new_stream(fh, old) as writer:
        writer.write_batch(pa.RecordBatch.from_arrays([batch.column(n) for n in old.names], schema=old))
    run = read_run(path)
    assert run.meta.version == 1 and run.meta.kind == "watch" and run.check_run is None
    assert run.steps["step"].tolist() == [0, 1] and run.complete
    assert run.matrix()[1][1].tolist() == [1.0, 2.0, 3.0]  # module i at step 1: i + 1
    assert run.table.column("check").null_count == 2


def test_check_steps_findings_keep_their_rank_and_a_file_from_before_still_reads(tmp_path):
    """Each finding of check_step's file carries the rank it is about (its finding_ranks column); a check
    file written before that column reads, its findings of no rank, and is not appended to."""
    import pyarrow as pa
    import torch

    from inspector.distributed import check_step

    model = torch.nn.Linear(2, 1)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    path = tmp_path / "new.inspect"
    check_step(model, 0, path)
    assert [(f.step, f.rank, f.code) for f in read_run(path).findings] == [(0, 0, "nonfinite-parameter")]
    with pa.ipc.open_stream(path.read_bytes()) as reader:
        table = reader.read_all().drop_columns(["finding_ranks"])
    old = tmp_path / "old.inspect"
    with open(old, "wb") as fh, pa.ipc.new_stream(fh, table.schema) as writer:
        writer.write_table(table)
    assert [(f.step, f.rank, f.code) for f in read_run(old).findings] == [(0, None, "nonfinite-parameter")]
    with pytest.raises(InspectorError, match="old.inspect exists and is not a check_step run file of this"):
        check_step(model, 1, old)


def test_float64_norms_are_written_as_their_float32_values():
    # the watch hands the writer its float64 norms; the batch casts each column to float32 once: the same
    # bytes as rows of float32 arrays (values that float32 rounds: 0.1, 1/3, 1e-8 + 1)
    values = np.array([0.1, 1 / 3, 1e-8 + 1], dtype=np.float64)
    wide = [StepRecord(step=s, rank=0, time=1.0, lr=[0.1], module_grad_norm=values * (s + 1),
                       module_param_norm=values, module_nonfinite=np.zeros(3, np.int32),
                       param_grad_norm=values + s) for s in range(4)]
    narrow = [dataclasses.replace(r, module_grad_norm=r.module_grad_norm.astype(np.float32),
                                  module_param_norm=r.module_param_norm.astype(np.float32),
                                  param_grad_norm=r.param_grad_norm.astype(np.float32)) for r in wide]
    assert record_batch(wide).serialize().to_pybytes() == record_batch(narrow).serialize().to_pybytes()
    assert record_batch(wide).column("param_grad_norm").type.value_type == "float"
