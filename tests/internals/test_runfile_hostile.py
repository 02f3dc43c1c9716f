"""Run files from elsewhere (an upload, a shared runs folder) are untrusted: every damaged, forged or
oversized one is refused with an InspectorError naming it, in bounded memory and time, and never ends
or freezes the process; a good one reads the same whichever way it is read.

The reader runs in a child process (``tests/runfile_child.py``) under an address-space limit, so a
crash (a signal), a freeze (the timeout) or a memory bomb (the limit, or a MemoryError) fails the test
instead of the test run.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inspector.runfiles import META_KEY, RunMeta, RunWriter, StepRecord, schema
from inspector.runfiles.columns import file_schema, record_batch
from inspector.runfiles.guard import (
    MAX_LRS,
    MAX_META_BYTES,
    MAX_MODULES,
    MAX_PARAMETERS,
    MAX_SCALARS,
    MAX_WORLD,
    check_meta,
    check_rows,
    check_schema,
    list_lengths,
    regular_fd,
)
from inspector.runfiles.tail import SMALL, RunTail, message_at
from inspector.runfolders import describe, list_runs
from inspector.utils.findings import InspectorError
from inspector.watching import LiveRun, parse_run_bytes, read_run

CHILD = Path(__file__).parents[1] / "runfile_child.py"
LIMIT_MB = 1024  # the child's address space beyond what it uses after its imports
# a read in the child longer than this is a freeze (the child also ends itself then: runfile_child.py);
# `make mutate` shortens it, so that a mutant that makes the reader spin costs seconds
TIMEOUT_S = int(os.environ.get("INSPECTOR_CHILD_TIMEOUT_S", "60"))


def _meta(modules: int = 2, world: int = 1) -> RunMeta:
    names = tuple(f"m{i}" for i in range(modules))
    return RunMeta(model="toy", world_size=world, every=1, modules=names,
                   parameters=tuple(f"{n}.w" for n in names), parameter_modules=tuple(range(modules)))


def _record(step: int, rank: int = 0, modules: int = 2, findings: bool = False) -> StepRecord:
    norms = np.arange(1, modules + 1, dtype=np.float32) * (step + 1)  # step 0: 1, 2; step 1: 2, 4; ...
    return StepRecord(step=step, rank=rank, time=float(step), loss=1.0 / (step + 1), lr=[0.1, 0.01],
                      scalar_names=["acc"], scalar_values=[0.5 + step],
                      module_grad_norm=norms, module_nonfinite=np.zeros(modules, np.int32),
                      param_grad_norm=norms,
                      findings=[{"code": "loss-spike", "severity": "warning", "where": "m0", "message": "up"}]
                      if findings else [])


@lru_cache(maxsize=16)
def _good(steps: int = 3, modules: int = 2, world: int = 1) -> bytes:
    sink = io.BytesIO()
    meta = _meta(modules, world)
    sink.write(file_schema().with_metadata({META_KEY: meta.to_json().encode()}).serialize().to_pybytes())
    for s in range(steps):
        rows = [_record(s, r, modules, findings=s == 1) for r in range(world)]
        sink.write(record_batch(rows).serialize().to_pybytes())
    return sink.getvalue() + b"\xff\xff\xff\xff\x00\x00\x00\x00"


def _messages(data: bytes) -> list[tuple[int, int, int]]:
    """``(offset, prefix and header bytes, body bytes)`` of each message of a good file."""
    out, at, view = [], 0, memoryview(data)
    while at < len(data):
        size, kind, body = message_at(view, at, "x")[:3]
        if kind == "end":
            break
        out.append((at, size, body))
        at += size + body
    return out


def _field_at(data: bytes, message: int, field: int) -> tuple[int, int]:
    """``(absolute position, count)`` of the record batch header field ``field`` of message ``message``:
    for field 0 (rows) the position of the int64, for a vector (1: nodes, 2: buffers) of its first entry.
    A flatbuffer: a table starts with the int32 distance back to its vtable (uint16 sizes, then one
    uint16 offset per field); a table or vector field holds the uint32 distance forward to it."""
    at, size, _ = _messages(data)[message]
    meta = data[at + 8:at + size]

    def table(pos):
        vt = pos - struct.unpack_from("<i", meta, pos)[0]
        return lambda i: pos + struct.unpack_from("<H", meta, vt + 4 + 2 * i)[0]

    def ref(pos):
        return pos + struct.unpack_from("<I", meta, pos)[0]

    header = table(ref(table(ref(0))(2)))  # Message (the root) -> its header: the RecordBatch
    if field == 0:
        return at + 8 + header(0), 1
    vec = ref(header(field))
    return at + 8 + vec + 4, struct.unpack_from("<I", meta, vec)[0]


def _declare(data: bytes, message: int, rows: int | None = None, nodes: int | None = None) -> bytes:
    """``data`` with record batch ``message`` declaring ``rows`` rows and every column ``nodes`` values."""
    out = bytearray(data)
    if rows is not None:
        pos, _ = _field_at(data, message, 0)
        struct.pack_into("<q", out, pos, rows)
    if nodes is not None:
        pos, n = _field_at(data, message, 1)
        for i in range(n):
            struct.pack_into("<q", out, pos + 16 * i, nodes)
    return bytes(out)


def _with_schema(columns: dict[str, pa.Array], rows: int = 1, compression: str | None = None) -> bytes:
    """A stream with the run metadata, the project's columns, some replaced by ``columns`` (any type)."""
    good = pa.Table.from_batches([record_batch([_record(s) for s in range(rows)])])
    for name, arr in columns.items():
        good = good.set_column(good.schema.get_field_index(name), name, arr)
    sch = good.schema.with_metadata({META_KEY: _meta().to_json().encode()})
    sink = io.BytesIO()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, sch, options=options) as w:
        w.write_table(good.replace_schema_metadata(sch.metadata))
    return sink.getvalue()


class Child:
    """The reader in a child process under ``LIMIT_MB`` of address space."""

    def __init__(self, folder: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, str(CHILD), str(LIMIT_MB), str(folder)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONPATH": str(CHILD.parent.parent)})
        assert json.loads(self._line(180))["ready"]

    def _line(self, timeout: float) -> str:
        import select

        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            pytest.fail(f"the reader took over {timeout} s (a freeze)")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            how = signal.Signals(-code).name if code < 0 else "exit"
            pytest.fail(f"the reader's process ended with {code} ({how}): a crash or the memory limit")
        return line

    def read(self, path: Path) -> dict:
        self.proc.stdin.write(f"{path}\n")
        self.proc.stdin.flush()
        out = json.loads(self._line(TIMEOUT_S))
        assert out["outcome"] != "bug", out["message"]
        return out

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def child(tmp_path_factory):
    c = Child(tmp_path_factory.mktemp("child"))
    yield c
    c.close()


def _bound_mb(size: int) -> float:
    return 64 + 4 * size / 2**20


BOMBS = {
    # the batch declares 1,000 rows and columns of 1,000 values over buffers of one row (was SIGSEGV)
    "more-rows-than-buffers": lambda: _declare(_good(), 1, rows=1000, nodes=1000),
    # two rows declared over one row's buffers, within the body's size: full validation refuses it
    "one-row-too-many": lambda: _declare(_good(), 1, rows=2, nodes=2),
    "2^40-rows": lambda: _declare(_good(), 1, rows=1 << 40, nodes=1 << 40),
    "2^40-values": lambda: _declare(_good(), 1, nodes=1 << 40),
    # 64 MiB of zeros in one list, ZSTD-compressed to a few KB
    "zstd-list-bomb": lambda: _with_schema({"lr": pa.array([np.zeros(8 << 20)], pa.list_(pa.float64()))},
                                           compression="zstd"),
    "run-end-encoded": lambda: _with_schema({"step": pa.RunEndEncodedArray.from_arrays(
        pa.array([1], pa.int32()), pa.array([0], pa.int64()))}),
    "dictionary": lambda: _with_schema({"scalar_names": pa.ListArray.from_arrays(
        pa.array([0, 1], pa.int32()), pa.array(["acc"]).dictionary_encode())}),
    "wrong-type": lambda: _with_schema({"step": pa.array(["0"])}),
}


@pytest.mark.parametrize("case", list(BOMBS))
def test_forged_and_bomb_files_are_refused_in_bounded_memory(child, tmp_path, case):
    data = BOMBS[case]()
    path = tmp_path / f"{case}.inspect"
    path.write_bytes(data)
    out = child.read(path)
    assert out["outcome"] == "refused", out
    assert path.name in out["message"] and out["row"].startswith("unreadable: ")
    assert out["peak_mb"] <= _bound_mb(len(data)), (case, out["peak_mb"], len(data))
    print(f"{case}: {len(data):,} bytes refused, peak RSS growth {out['peak_mb']:.1f} MiB: {out['message']}")


def test_a_good_file_reads_the_same_in_the_child(child, tmp_path):
    path = tmp_path / "good.inspect"
    path.write_bytes(_good(4, 3, 2))
    assert child.read(path) == {**child.read(path), "outcome": "ok", "rows": 8}


TYPES = [pa.int8(), pa.float16(), pa.string(), pa.large_string(), pa.binary(), pa.null(), pa.bool_(),
         pa.large_list(pa.float32()), pa.list_(pa.float64()), pa.list_(pa.list_(pa.float32())),
         pa.list_(pa.float32(), 2), pa.struct([("a", pa.int64())]), pa.dictionary(pa.int32(), pa.string()),
         pa.string_view(), pa.list_view(pa.float32())]
CODES = [0, 1, 2, 7, 8, 255, 2**31 - 1, 2**31, 2**32 + 1, 2**40, 2**62, -1, -(2**40)]


@st.composite
def _hostile(draw):
    steps, modules, world = draw(st.integers(1, 3)), draw(st.integers(0, 3)), draw(st.integers(1, 2))
    data = _good(steps, modules, world)
    kind = draw(st.sampled_from(["count", "bytes", "cut", "type", "codec", "declared"]))
    batches = len(_messages(data)) - 1
    if kind == "count":
        message = draw(st.integers(1, batches))
        field = draw(st.integers(0, 2))
        pos, n = _field_at(data, message, field)
        pos += 0 if field == 0 else 16 * draw(st.integers(0, n - 1)) + 8 * draw(st.integers(0, 1))
        out = bytearray(data)
        struct.pack_into("<q", out, pos, draw(st.sampled_from(CODES)))
        return kind, bytes(out)
    first = draw(st.sampled_from([0, _messages(data)[1][0]]))  # in the schema, or in the batches
    if kind == "bytes":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            out[draw(st.integers(first, len(out) - 1))] = draw(st.integers(0, 255))
        return kind, bytes(out)
    if kind == "cut":
        return kind, data[:draw(st.integers(first, len(data) - 1))]
    if kind == "declared":
        return kind, _declare(data, draw(st.integers(1, batches)), rows=draw(st.sampled_from(CODES)),
                              nodes=draw(st.sampled_from(CODES)))
    if kind == "codec":
        return kind, _with_schema({}, rows=steps, compression=draw(st.sampled_from(["lz4", "zstd"])))
    column = draw(st.sampled_from([f.name for f in file_schema()]))
    typ = draw(st.sampled_from(TYPES))
    if file_schema().field(column).type == typ:
        kind = "same type"
    return kind, _with_schema({column: pa.nulls(1, typ) if not pa.types.is_dictionary(typ)
                               else pa.array(["x"]).dictionary_encode()})


FUZZ_EXAMPLES = int(os.environ.get("INSPECTOR_FUZZ_EXAMPLES", "60"))  # more for a longer search


@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=FUZZ_EXAMPLES <= 60)
@given(_hostile())
def test_fuzz_the_reader_refuses_or_reads_never_crashes(child, tmp_path_factory, case):
    kind, data = case
    path = tmp_path_factory.mktemp("fuzz") / "f.inspect"
    path.write_bytes(data)
    out = child.read(path)
    assert out["outcome"] in ("ok", "refused"), out
    if kind in ("type", "codec"):
        assert out["outcome"] == "refused", out
    if out["outcome"] == "ok":
        assert out["rows"] <= 6
    if os.environ.get("INSPECTOR_FUZZ_LOG"):
        with open(os.environ["INSPECTOR_FUZZ_LOG"], "a") as log:
            log.write(f"{kind}\t{out['outcome']}\t{out.get('message', '')[:150]}\n")
    assert out["peak_mb"] <= LIMIT_MB


def _alarm(seconds: int):
    def fail(*_):
        raise TimeoutError("froze")
    signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)


def test_a_fifo_in_a_runs_folder_is_listed_never_opened(tmp_path):
    os.mkfifo(tmp_path / "trap.inspect")
    (tmp_path / "good.inspect").write_bytes(_good())
    _alarm(20)
    try:
        entries = list_runs([tmp_path])
        with pytest.raises(InspectorError, match="trap.inspect is not a regular file .a FIFO"):
            read_run(tmp_path / "trap.inspect")
        with pytest.raises(InspectorError, match="not a regular file"):
            LiveRun(tmp_path / "trap.inspect").read()
    finally:
        signal.alarm(0)
    assert [e.name for e in entries] == ["good.inspect"]


def test_a_wrongly_typed_run_breaks_only_its_own_row(tmp_path):
    (tmp_path / "bad.inspect").write_bytes(_with_schema({"rank": pa.array(["0"])}))
    (tmp_path / "good.inspect").write_bytes(_good())
    assert 2000 < (tmp_path / "bad.inspect").stat().st_size < 8000  # a 4 KB file
    rows = {e.name: describe(e) for e in list_runs([tmp_path])}
    assert rows["good.inspect"]["steps"] == 3
    assert rows["good.inspect"]["first finding"] == "step 1: loss-spike at m0"
    assert rows["bad.inspect"]["steps"] is None
    assert rows["bad.inspect"]["first finding"].startswith("unreadable: bad.inspect: column rank is string")


def test_a_zero_step_run_is_a_live_run_of_zero_steps(tmp_path):
    path = tmp_path / "fresh.inspect"
    writer = RunWriter(path, _meta())  # the schema is written at open
    assert path.stat().st_size > 0
    run = read_run(path)
    assert len(run.steps) == 0 and not run.complete and run.findings == []
    assert list(run.steps.columns[:2]) == ["step", "rank"] and run.matrix()[1].shape == (0, 2)
    [entry] = list_runs([tmp_path])
    assert entry.live and describe(entry)["steps"] == 0
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(Path(__file__).parents[2] / "pages" / "8_Training.py"), default_timeout=60)
    at.query_params["run"] = str(path)
    os.environ["INSPECTOR_RUNS"] = str(tmp_path)
    try:
        at.run()
    finally:
        del os.environ["INSPECTOR_RUNS"]
    assert not at.exception, at.exception
    assert any("0 steps so far" in i.value for i in at.info), [i.value for i in at.info]
    writer.close()


def test_ten_thousand_lrs_and_scalar_names_read_in_a_second(tmp_path):
    path = tmp_path / "wide.inspect"
    n = 10_000
    with RunWriter(path, _meta()) as w:
        for s in range(3):
            w.write([StepRecord(step=s, rank=0, time=0.0, lr=list(np.arange(n) * 1e-3 + s),
                                scalar_names=[f"s{i}" for i in range(n)],
                                scalar_values=list(np.arange(n) + s))])
    t = time.perf_counter()
    run = read_run(path)
    took = time.perf_counter() - t
    print(f"10,000 lrs and 10,000 scalar names × 3 steps read in {took:.3f} s")
    assert took <= 1.0 * 5  # 1 s on an idle machine; slack for a loaded one
    assert run.steps.shape == (3, 13 + 2 * n)
    assert run.steps["lr_9999"].tolist() == [9.999, 10.999, 11.999]  # 9999e-3 + step
    assert run.steps["s42"].tolist() == [42.0, 43.0, 44.0]
    with RunWriter(tmp_path / "too-many.inspect", _meta()) as w:
        w.write([StepRecord(step=0, rank=0, time=0.0, lr=[0.0] * (MAX_LRS + 1))])
    with pytest.raises(InspectorError, match=r"too-many.inspect: a row has 100,001 learning rates"):
        read_run(tmp_path / "too-many.inspect")


def test_many_rows_of_sparse_names_are_refused_not_expanded(tmp_path):
    """Each row names a new scalar: 20,000 rows × 20,000 names would be 3 GiB of NaN from a 3 MB file."""
    path = tmp_path / "sparse.inspect"
    with RunWriter(path, _meta()) as w:
        for s in range(0, 20_000, 500):
            w.write([StepRecord(step=i, rank=0, time=0.0, scalar_names=[f"n{i}"], scalar_values=[1.0])
                     for i in range(s, s + 500)])
    with pytest.raises(InspectorError, match="learning rates and scalar names is more than a file of"):
        read_run(path)


def test_following_a_growing_file_gives_the_run_a_full_read_gives(tmp_path):
    path = tmp_path / "grow.inspect"
    live = LiveRun(path.with_name("missing.inspect"))
    with pytest.raises(InspectorError, match="missing.inspect cannot be read"):
        live.read()
    writer = RunWriter(path, _meta(3, 2))
    live = LiveRun(path)
    seen = []
    for s in range(7):
        for rank in range(2):
            writer.write([_record(s, rank, 3, findings=s == 4)])
            if rank == 0 and s % 2:  # half a message on disk: the writer mid-step
                raw = record_batch([_record(99, 1, 3)]).serialize().to_pybytes()
                with open(path, "ab") as fh:
                    fh.write(raw[:len(raw) // 2])
                run = live.read()
                assert not run.complete
                with open(path, "r+b") as fh:
                    fh.truncate(writer.bytes_written)
                seen.append(len(run.steps))
                continue
            seen.append(len(live.read().steps))
    writer.close()
    followed, full = live.read(), read_run(path)
    assert seen == list(range(1, 15)) and followed.complete and full.complete
    assert followed.steps.equals(full.steps) and followed.findings == full.findings
    np.testing.assert_array_equal(followed.matrix()[1], full.matrix()[1])
    assert followed.table.equals(full.table) and followed.table.column("step").num_chunks <= SMALL
    rewritten = RunWriter(path, _meta(3, 2))  # the same name, a new file: read from its start
    rewritten.write([_record(0, 0, 3)])
    assert len(live.read().steps) == 1
    rewritten.close()


def test_a_file_that_shrinks_while_it_is_read_stops_at_what_is_there():
    # the size was read (fstat), then the file was cut before its bytes were: each read gets less than
    # it asked for, down to nothing; the reader keeps what is whole and waits, it does not loop on it
    data = _good(4)
    cut = _messages(data)[3][0] + 5  # the schema, two batches and 5 bytes of the third
    tail = RunTail(data=data[:cut], name="shrunk.inspect")
    view = memoryview(data[:cut])
    _alarm(20)
    try:
        added = tail._read(lambda at, n: view[at:at + n], len(data))
    finally:
        signal.alarm(0)
    assert (added, tail.rows, tail.offset, tail.cut, tail.closed) == (2, 2, cut - 5, True, False)

def test_an_upload_reads_as_the_file_does(tmp_path):
    data = _good(5, 2, 2)
    (tmp_path / "u.inspect").write_bytes(data)
    upload, path = parse_run_bytes(data, "u.inspect"), read_run(tmp_path / "u.inspect")
    assert upload.steps.equals(path.steps) and upload.complete
    assert upload.steps["lr_1"].tolist() == [0.01] * 10
    assert upload.steps["acc"].tolist()[::2] == [0.5, 1.5, 2.5, 3.5, 4.5]  # rank 0: 0.5 + step
    assert [f.step for f in upload.findings] == [1, 1]  # both ranks at step 1
    assert schema().names[:2] == ["step", "rank"]


def test_a_growing_runs_row_reads_on_and_says_what_a_whole_read_says(tmp_path):
    from inspector.runfolders import RunSummary

    path = tmp_path / "grow.inspect"
    writer = RunWriter(path, _meta())
    summary = RunSummary(path)
    [entry] = list_runs([tmp_path])
    assert describe(entry, summary)["steps"] == 0
    for s in range(3):
        writer.write([_record(s, findings=s == 1)])
    row = describe(entry, summary)
    assert row == describe(entry) and row["steps"] == 3 and row["first finding"] == "step 1: loss-spike at m0"
    offset = summary.tail.offset
    writer.write([_record(3)])
    assert describe(entry, summary)["steps"] == 4 and summary.tail.offset > offset  # read on, not again
    writer.close()


def test_healthy_steps_nan_counts_are_kept_once_and_a_count_stays_at_its_step(tmp_path):
    """One batch per step, as the watch writes. Every healthy step counts 0 NaN/Inf values per module:
    the kept steps share one buffer of zeros instead of a copy each (on a 300k-step × 100-module run,
    115 MiB of the 380 kept), and the one step that counted some keeps its counts."""
    steps, modules, bad = 20_000, 64, (19_990, 7)  # the bad step among the last rows: a small kept piece
    path = tmp_path / "long.inspect"
    counts = np.zeros((steps, modules), np.int32)
    counts[bad] = 3
    rows = [StepRecord(step=s, rank=0, time=float(s), module_grad_norm=np.full(modules, 1.0 + s, np.float32),
                       module_nonfinite=counts[s], param_grad_norm=np.ones(modules, np.float32))
            for s in range(steps)]
    with open(path, "wb") as fh:
        fh.write(file_schema().with_metadata({META_KEY: _meta(modules).to_json().encode()}).serialize())
        batch = record_batch(rows)
        for s in range(steps):
            fh.write(batch.slice(s, 1).serialize())
    pool = pa.system_memory_pool()  # where the reader keeps the steps
    before = pool.bytes_allocated()
    run = read_run(path)
    kept = pool.bytes_allocated() - before
    zeros = steps * modules * 4  # the counts as int32
    others = sum(run.table.column(c).nbytes for c in run.table.column_names
                 if c not in ("module_nonfinite", "check"))  # check: the null column of a watch's file
    print(f"kept {kept / 2**20:.1f} MiB: the other columns {others / 2**20:.1f} MiB, the counts "
          f"{zeros / 2**20:.1f} MiB")
    assert kept < others + zeros / 4  # a copy of the counts per kept batch would be `zeros` more
    _, found = run.matrix("nonfinite")
    assert found[bad] == 3 and found.sum() == 3
    np.testing.assert_array_equal(found, counts)
    assert run.at(bad[0])["nonfinite"].tolist() == [0.0] * 7 + [3.0] + [0.0] * (modules - 8)
    followed = LiveRun(path).read()
    np.testing.assert_array_equal(followed.matrix("nonfinite")[1], counts)


@pytest.mark.parametrize("text", ["", "a", "a\n", "a\r\nb", "a\rb\r", "\r\n\r\n", "a\n\nb\r\r\nc"])
def test_json_lines_are_counted_as_they_are_read(text):
    from inspector.runfiles.jsonlines import count_lines, text_line_count, text_lines

    assert text_line_count(text) == len(list(text_lines(text)))
    assert count_lines(io.BytesIO(text.encode())) == len(list(text_lines(text)))


def test_a_crlf_split_between_blocks_is_one_line_end():
    from inspector.runfiles.jsonlines import count_lines

    data = b"x" * ((1 << 16) - 1) + b"\r\n" + b"y\n"
    fh = io.BytesIO(data)
    assert count_lines(fh) == 2 and fh.tell() == 0


@pytest.mark.parametrize("version, said", [("9" * 5000, "a number of 5,000 digits"),
                                           ('"3"', "version '3' is not a whole number")])
def test_a_forged_version_is_refused_in_words(tmp_path, version, said):
    """Once Python's own text about its integer digit limit (or a TypeError) reached the message."""
    text = _meta().to_json().replace('"version":2', f'"version":{version}')
    assert text != _meta().to_json()
    path = tmp_path / "forged.inspect"
    path.write_bytes(file_schema().with_metadata({META_KEY: text.encode()}).serialize().to_pybytes()
                     + b"\xff\xff\xff\xff\x00\x00\x00\x00")
    with pytest.raises(InspectorError, match="forged.inspect") as caught:
        read_run(path)
    assert said in str(caught.value) and "sys.set_int_max_str_digits" not in str(caught.value)


def _ranks_file(ranks: list[int], world: int) -> bytes:
    """A two-module run of ``world`` ranks whose one step has a row for each of ``ranks``."""
    sink = io.BytesIO()
    sink.write(file_schema().with_metadata({META_KEY: _meta(2, world).to_json().encode()}).serialize()
               .to_pybytes())
    sink.write(record_batch([_record(0, r) for r in ranks]).serialize().to_pybytes())
    return sink.getvalue() + b"\xff\xff\xff\xff\x00\x00\x00\x00"


@pytest.mark.parametrize(("ranks", "bad"), [([0, 2], 2), ([0, 7], 7), ([-2, 1], -2), ([-1, 2], 2)])
def test_a_rank_outside_the_world_is_refused_by_every_reader(tmp_path, ranks, bad):
    # ranks of a 2-rank run are 0 and 1 (and -1, the run's own rows): rank 2 is the world size itself
    data = _ranks_file(ranks, 2)
    (tmp_path / "r.inspect").write_bytes(data)
    message = f"r.inspect: rank {bad} in a run of 2 ranks: the file is damaged"
    with pytest.raises(InspectorError, match=message):
        parse_run_bytes(data, "r.inspect")
    with pytest.raises(InspectorError, match=message):
        read_run(tmp_path / "r.inspect")
    [entry] = list_runs([tmp_path])
    assert describe(entry)["first finding"] == f"unreadable: {message}"


def test_the_last_rank_and_the_run_rows_are_in_range(tmp_path):
    run = parse_run_bytes(_ranks_file([-1, 0, 1], 2), "r.inspect")
    assert run.steps["rank"].tolist() == [-1, 0, 1] and run.world_size == 2


# ------------------------------------------------------------------ each forgery refused by its own check
# The checks overlap (a forged row count is caught by the header check, and Arrow's full validation would
# catch most of what the header check does), so each case names the check that must refuse it: a header
# check that lets its forgery through shows as another message here.
def _body(data: bytes) -> int:
    return _messages(data)[1][2]  # the first record batch's body bytes


def _buffer(data: bytes, index: int, offset: int | None = None, length: int | None = None) -> bytes:
    """``data`` with buffer ``index`` of its first record batch at ``offset`` and ``length``."""
    out = bytearray(data)
    pos, _ = _field_at(data, 1, 2)
    for at, value in ((pos + 16 * index, offset), (pos + 16 * index + 8, length)):
        if value is not None:
            struct.pack_into("<q", out, at, value)
    return bytes(out)


def _length(data: bytes, column: int, length: int) -> bytes:
    """``data`` with array ``column`` of its first record batch (a field node: nested lists have one per
    level) declaring ``length`` values (its null count kept)."""
    out = bytearray(data)
    pos, _ = _field_at(data, 1, 1)
    struct.pack_into("<q", out, pos + 16 * column, length)
    return bytes(out)


def _utf8_broken(data: bytes) -> bytes:
    """``data`` with the scalar name ``acc`` of its first record batch made bytes that are no UTF-8."""
    at, size, body = _messages(data)[1]
    start = data.index(b"acc", at + size, at + size + body)
    return data[:start] + b"\xff\xfe" + data[start + 2:]


def _compressed(codec: str) -> bytes:
    """A run of the project's own columns, with its record batch compressed."""
    sink = io.BytesIO()
    sch = file_schema().with_metadata({META_KEY: _meta().to_json().encode()})
    with pa.ipc.new_stream(sink, sch, options=pa.ipc.IpcWriteOptions(compression=codec)) as w:
        w.write_batch(record_batch([_record(0)]))
    return sink.getvalue()


def _rows_said(rows: int, body: int) -> str:
    return f"a record batch declares {rows:,} rows in {body:,} bytes; at most {body // 8:,} fit: the file " \
           "is damaged or forged"


B = _body(_good())  # 8 bytes a row at most: B // 8 rows fit in B bytes
FORGED = {
    "rows -1": (lambda: _declare(_good(), 1, rows=-1), _rows_said(-1, B)),
    "one row past the limit": (lambda: _declare(_good(), 1, rows=B // 8 + 1), _rows_said(B // 8 + 1, B)),
    "values -1": (lambda: _declare(_good(), 1, nodes=-1), f"a column declares more values than its {B:,} "
                                                          "bytes hold"),
    "one value past the limit": (lambda: _declare(_good(), 1, nodes=8 * B + 9),
                                 f"a column declares more values than its {B:,} bytes hold"),
    "a buffer one byte past the body": (lambda: _buffer(_good(), 1, offset=0, length=B + 1),
                                        f"a buffer lies outside its record batch's {B:,} bytes"),
    "one column one value past the limit": (lambda: _length(_good(), 1, 8 * B + 9),
                                            f"a column declares more values than its {B:,} bytes hold"),
    "the last array one value past the limit": (
        lambda: _length(_good(), _field_at(_good(), 1, 1)[1] - 1, 8 * B + 9),
        f"a column declares more values than its {B:,} bytes hold"),
    "a buffer ending one byte past the body": (lambda: _buffer(_good(), 1, offset=B, length=1),
                                               f"a buffer lies outside its record batch's {B:,} bytes"),
    "a buffer at offset -1": (lambda: _buffer(_good(), 1, offset=-1),
                              f"a buffer lies outside its record batch's {B:,} bytes"),
    "a buffer of length -1": (lambda: _buffer(_good(), 1, length=-1),
                              f"a buffer lies outside its record batch's {B:,} bytes"),
    "lz4": (lambda: _compressed("lz4"), "a record batch with compressed buffers (LZ4/ZSTD); a run file is "
                                        "never compressed: not read"),
    "zstd": (lambda: _compressed("zstd"), "a record batch with compressed buffers (LZ4/ZSTD); a run file is "
                                          "never compressed: not read"),
    # only the full validation reads the strings' bytes
    "a name that is no UTF-8": (lambda: _utf8_broken(_good()), "a record batch is damaged ("),
    # at the limits the header checks let the batch through; Arrow's validation refuses it
    "rows at the limit": (lambda: _declare(_good(), 1, rows=B // 8), "a message at byte "),
    "values at the limit": (lambda: _declare(_good(), 1, nodes=8 * B + 8), "a message at byte "),
}


@pytest.mark.parametrize("case", list(FORGED))
def test_a_forged_header_is_refused_by_the_check_for_it(case):
    # in this process (the forgeries are small; the child above reads the bombs), so that a tool tracing
    # which tests call the checks sees this one
    make, said = FORGED[case]
    with pytest.raises(InspectorError) as err:
        parse_run_bytes(make(), "f.inspect")
    message = str(err.value)
    if said.endswith("("):
        assert message.startswith(f"f.inspect: {said}") and message.endswith("): not read"), message
    elif said.startswith("a message at byte "):
        assert message.startswith(f"f.inspect: {said}") and "declares" not in message, message
    else:
        assert message == f"f.inspect: {said}"


# ------------------------------------------------------------------ the framing of each message, forged
def _framed(data: bytes, message: int, edit) -> bytes:
    """``data`` with ``edit(meta, root, vtable)`` applied to the flatbuffer ``Message`` of message
    ``message`` (a bytearray of its header, the root table's position and its vtable's)."""
    at, size, _ = _messages(data)[message]
    meta = bytearray(data[at + 8:at + size])
    root = struct.unpack_from("<I", meta, 0)[0]
    edit(meta, root, root - struct.unpack_from("<i", meta, root)[0])
    return data[:at + 8] + bytes(meta) + data[at + size:]


def _message_field(meta: bytearray, root: int, vt: int, field: int) -> int:
    """Where field ``field`` of the ``Message`` is (0 version, 1 header type, 2 header, 3 body length)."""
    return root + struct.unpack_from("<H", meta, vt + 4 + 2 * field)[0]


def _prefix(data: bytes, marker: int | None = None, length: int | None = None) -> bytes:
    """``data`` with the first record batch's continuation marker and header length forged."""
    out, at = bytearray(data), _messages(data)[1][0]
    if marker is not None:
        struct.pack_into("<I", out, at, marker)
    if length is not None:
        struct.pack_into("<i", out, at + 4, length)
    return bytes(out)


AT = _messages(_good())[1][0]  # where the first record batch starts


def _damaged(why: str) -> str:
    return f"a message at byte {AT:,} is damaged ({why}): not read"


ONLY_BATCHES = "message after the schema; a run file holds only record batches: not read"
FRAMING = {
    "no continuation marker": (lambda: _prefix(_good(), marker=0), _damaged(
        "the bytes there are not an Arrow IPC message (no continuation marker)")),
    "a header one byte over the limit": (lambda: _prefix(_good(), length=MAX_META_BYTES + 1), _damaged(
        f"a message header of {MAX_META_BYTES + 1:,} bytes (at most {MAX_META_BYTES:,})")),
    "a header of -1 bytes": (lambda: _prefix(_good(), length=-1), _damaged(
        f"a message header of -1 bytes (at most {MAX_META_BYTES:,})")),
    "a body of -1 bytes": (lambda: _framed(_good(), 1, lambda m, r, vt: struct.pack_into(
        "<q", m, _message_field(m, r, vt, 3), -1)), _damaged("a message body of -1 bytes")),
    "a root table whose vtable lies before the header": (lambda: _framed(_good(), 1, lambda m, r, vt: (
        struct.pack_into("<i", m, r, r + 4))), _damaged("a message header points outside itself")),
    # the root at 0 reads its own offset (0) as the distance to its vtable, which has no fields
    "a root table at 0": (lambda: _framed(_good(), 1, lambda m, r, vt: struct.pack_into("<I", m, 0, 0)),
                          f"a unknown {ONLY_BATCHES}"),
    "a message type of 9": (lambda: _framed(_good(), 1, lambda m, r, vt: struct.pack_into(
        "<B", m, _message_field(m, r, vt, 1), 9)), f"a unknown {ONLY_BATCHES}"),
    "no message type": (lambda: _framed(_good(), 1, lambda m, r, vt: struct.pack_into("<H", m, vt + 6, 0)),
                        f"a unknown {ONLY_BATCHES}"),
    "a record batch without its header": (lambda: _framed(_good(), 1, lambda m, r, vt: struct.pack_into(
        "<H", m, vt + 8, 0)), f"a record batch {ONLY_BATCHES}"),
}


@pytest.mark.parametrize("case", list(FRAMING))
def test_a_forged_frame_is_refused_in_words(case):
    make, said = FRAMING[case]
    with pytest.raises(InspectorError) as err:
        parse_run_bytes(make(), "f.inspect")
    assert str(err.value) == f"f.inspect: {said}"


def test_a_header_at_the_limit_is_a_message_not_whole_yet():
    # 64 MiB of header is allowed: the message is then not whole in the file (a writer mid-step)
    run = parse_run_bytes(_prefix(_good(), length=MAX_META_BYTES), "f.inspect")
    assert (len(run.steps), run.complete) == (0, False)


def test_list_lengths_reads_a_slice_and_its_null_rows():
    column = pa.array([[1.0], [1.0, 2.0], None, [3.0, 4.0, 5.0], [6.0]], pa.list_(pa.float32()))
    lengths, valid = list_lengths(column.slice(1, 3))  # its offsets start one row in and go on past it
    assert (lengths.tolist(), valid.tolist()) == ([2, 0, 3], [True, False, True])
    lengths, valid = list_lengths(column.slice(3))
    assert (lengths.tolist(), valid.tolist()) == ([3, 1], [True, True])
    for empty in (column.slice(5), pa.array([], pa.list_(pa.float32()))):
        lengths, valid = list_lengths(empty)
        assert (lengths.tolist(), valid.tolist(), lengths.dtype.kind) == ([], [], "i")


def test_a_missing_file_is_named_and_a_run_file_opens_without_blocking(tmp_path):
    with pytest.raises(InspectorError) as err:
        regular_fd(tmp_path / "gone.inspect")
    gone = tmp_path / "gone.inspect"
    assert str(err.value) == f"run file {gone} cannot be read (No such file or directory)"
    (tmp_path / "r.inspect").write_bytes(_good())
    fd = regular_fd(tmp_path / "r.inspect")
    try:  # a file swapped for a FIFO after the check would not block the reader
        import fcntl
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
    finally:
        os.close(fd)

def test_an_empty_record_batch_reads_as_no_steps(tmp_path):
    sink = io.BytesIO()
    sch = file_schema().with_metadata({META_KEY: _meta().to_json().encode()})
    with pa.ipc.new_stream(sink, sch) as w:
        w.write_batch(record_batch([_record(0)]).slice(0, 0))
    assert len(_messages(sink.getvalue())) == 2  # the schema and one batch, of no rows
    (tmp_path / "e.inspect").write_bytes(sink.getvalue())
    assert len(parse_run_bytes(sink.getvalue(), "e.inspect").steps) == 0
    assert len(read_run(tmp_path / "e.inspect").steps) == 0


def _block_device() -> Path | None:
    return next((p for p in Path("/dev").iterdir() if p.exists() and stat.S_ISBLK(os.stat(p).st_mode)), None)


@pytest.mark.timeout(30)
def test_what_is_no_regular_file_is_named_before_it_is_opened(tmp_path):
    os.mkfifo(tmp_path / "pipe.inspect")
    (tmp_path / "folder.inspect").mkdir()
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock.inspect"))
    try:
        special = {"pipe.inspect": "a FIFO", "folder.inspect": "a folder", "sock.inspect": "a socket"}
        for name, kind in special.items():
            with pytest.raises(InspectorError) as err:
                regular_fd(tmp_path / name)
            assert str(err.value) == f"{name} is not a regular file ({kind}); a run file is a regular file " \
                                     "written by inspector.watch or check_step"
        with pytest.raises(InspectorError, match=r"^null is not a regular file \(a character device\); "):
            regular_fd("/dev/null")
        block = _block_device()
        if block is not None:
            said = rf"^{block.name} is not a regular file \(a block device\); "
            with pytest.raises(InspectorError, match=said):
                regular_fd(block)
    finally:
        sock.close()


def _rows_file(records: list[StepRecord], modules: int = 2) -> bytes:
    sink = io.BytesIO()
    sink.write(file_schema().with_metadata({META_KEY: _meta(modules).to_json().encode()}).serialize()
               .to_pybytes())
    sink.write(record_batch(records).serialize().to_pybytes())
    return sink.getvalue() + b"\xff\xff\xff\xff\x00\x00\x00\x00"


def test_a_row_of_the_wrong_width_is_named_with_its_count():
    # a run of 2 modules; step 1's row has 3 numbers per module
    data = _rows_file([_record(0), _record(1, modules=3)])
    with pytest.raises(InspectorError) as err:
        parse_run_bytes(data, "w.inspect")
    assert str(err.value) == "w.inspect: a row of module_grad_norm has 3 values, not one per module (2): " \
                             "the file is damaged"
    wide = dataclasses.replace(_record(1), param_grad_norm=np.ones(3, np.float32))  # 3 for 2 parameters
    with pytest.raises(InspectorError) as err:
        parse_run_bytes(_rows_file([_record(0), wide]), "p.inspect")
    assert str(err.value) == "p.inspect: a row of param_grad_norm has 3 values, not one per parameter (2): " \
                             "the file is damaged"


def test_a_row_with_more_scalar_names_than_values_is_refused():
    odd = StepRecord(step=0, rank=0, time=0.0, scalar_names=["a", "b"], scalar_values=[1.0])
    with pytest.raises(InspectorError) as err:
        parse_run_bytes(_rows_file([odd]), "s.inspect")
    assert str(err.value) == "s.inspect: a row has not as many scalar values as scalar names: the file is " \
                             "damaged"


def test_lrs_and_scalar_names_up_to_their_limits_pass_and_one_more_is_refused():
    """On the batch, before any table is built (a table of 100,000 names is slow to build, not wrong)."""
    names = [f"s{i}" for i in range(MAX_SCALARS + 1)]
    at_limit = StepRecord(step=0, rank=0, time=0.0, lr=[0.1] * MAX_LRS, scalar_names=names[:-1],
                          scalar_values=[1.0] * MAX_SCALARS)
    check_rows(record_batch([at_limit]), _meta(0), "l.inspect")
    over = StepRecord(step=0, rank=0, time=0.0, scalar_names=names, scalar_values=[1.0] * (MAX_SCALARS + 1))
    with pytest.raises(InspectorError) as err:
        check_rows(record_batch([over]), _meta(0), "l.inspect")
    assert str(err.value) == f"l.inspect: a row logs {MAX_SCALARS + 1:,} scalars (at most {MAX_SCALARS:,})"


def test_a_check_step_file_has_its_own_columns():
    check_schema(file_schema("check"), "check", "c.inspect")  # the check and finding_ranks columns too
    with pytest.raises(InspectorError, match="has columns the project never writes .check, finding_ranks."):
        check_schema(file_schema("check"), "watch", "c.inspect")


@pytest.mark.parametrize("column", ["step", "rank"])
def test_a_row_without_a_step_or_a_rank_is_refused(column):
    table = pa.Table.from_batches([record_batch([_record(0), _record(1)])])
    i = table.schema.get_field_index(column)
    nulled = pa.array([table[column][0].as_py(), None], table.schema.field(i).type)
    batch = table.set_column(i, table.schema.field(i), nulled).to_batches()[0]
    sink = io.BytesIO()
    sink.write(file_schema().with_metadata({META_KEY: _meta().to_json().encode()}).serialize().to_pybytes())
    sink.write(batch.serialize().to_pybytes())
    with pytest.raises(InspectorError) as err:
        parse_run_bytes(sink.getvalue() + b"\xff\xff\xff\xff\x00\x00\x00\x00", "n.inspect")
    assert str(err.value) == "n.inspect: a row without a step or rank: the file is damaged"


def _schema_refusal(sch: pa.Schema, kind: str = "watch") -> str:
    with pytest.raises(InspectorError) as err:
        check_schema(sch, kind, "c.inspect")
    return str(err.value)


def test_each_schema_fault_is_named():
    watch = file_schema()
    assert _schema_refusal(watch.remove(watch.get_field_index("loss"))) == \
        "c.inspect lacks the column loss; it was not written by inspector.watch or check_step"
    check_schema(watch, "check", "c.inspect")  # a version 1 check_step file: no check column, read as null
    i = watch.get_field_index("loss")
    assert _schema_refusal(watch.set(i, pa.field("loss", pa.string()))) == \
        "c.inspect: column loss is string, not double as the project writes it: not read"
    extra = watch
    for n in range(6):
        extra = extra.append(pa.field(f"x{n}", pa.int8()))
    assert _schema_refusal(extra) == "c.inspect has columns the project never writes (x0, x1, x2, x3, x4): " \
                                     "not read"
    first, second = watch.field(0), watch.field(1)
    assert _schema_refusal(watch.set(0, second).set(1, first)) == \
        "c.inspect: its columns are not in the order the project writes them: not read"


def _meta_refusal(raw: bytes) -> str:
    with pytest.raises(InspectorError) as err:
        check_meta(raw, "m.inspect")
    return str(err.value)


def test_each_metadata_limit_is_named():
    assert _meta_refusal(b" " * (MAX_META_BYTES + 1)) == \
        f"m.inspect: {MAX_META_BYTES + 1:,} bytes of run metadata (at most {MAX_META_BYTES:,})"
    items = MAX_MODULES + 2 * MAX_PARAMETERS + 1000  # one item more than commas
    assert _meta_refusal(b"," * items) == f"m.inspect: run metadata of {items + 1:,} items, more than " \
                                          f"{MAX_MODULES:,} modules and {MAX_PARAMETERS:,} parameters take"
    assert "items" not in _meta_refusal(b"," * (items - 1))  # at the limit: refused as JSON, not counted
    assert _meta_refusal(b"[" * 100_000) == "m.inspect: its run metadata is nested too deeply to be a run's"
    assert check_meta(_meta(world=MAX_WORLD).to_json().encode(), "m.inspect").world_size == MAX_WORLD
    assert _meta_refusal(_meta(world=MAX_WORLD + 1).to_json().encode()) == \
        f"m.inspect: 2 modules, 2 parameters and {MAX_WORLD + 1:,} ranks; at most {MAX_MODULES:,}, " \
        f"{MAX_PARAMETERS:,} and {MAX_WORLD:,}"
    assert _meta_refusal(_meta(modules=MAX_MODULES + 1).to_json().encode()).startswith(
        f"m.inspect: {MAX_MODULES + 1:,} modules, {MAX_MODULES + 1:,} parameters and 1 ranks; ")
