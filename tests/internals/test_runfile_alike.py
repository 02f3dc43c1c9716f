"""Steps laid out alike are read at once (:mod:`inspector.runfiles.alike`): the rows are those Arrow's own
stream reader gives, a followed run's appended steps are not decoded one message at a time, and a
damaged message in a run of alike ones is refused as when each is read alone."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inspector.runfiles import RunMeta, RunWriter, StepRecord
from inspector.runfiles.tail import PENDING, RunTail, message_at, read_all, scan
from inspector.utils.findings import InspectorError
from inspector.watching import LiveRun

MODULES = 3


def _meta(world: int = 1) -> RunMeta:
    names = tuple(f"m{i}" for i in range(MODULES))
    return RunMeta(model="toy", world_size=world, every=1, modules=names,
                   parameters=tuple(f"{n}.w" for n in names), parameter_modules=tuple(range(MODULES)))


def _record(step: int, rank: int = 0, **kw) -> StepRecord:
    norms = np.full(MODULES, 1.0 + step, np.float32)
    values = {"loss": 1.0 / (1 + step), "lr": [1e-3], **kw}
    return StepRecord(step=step, rank=rank, time=float(step), grad_norm=float(step), module_grad_norm=norms,
                      module_nonfinite=np.zeros(MODULES, np.int32), param_grad_norm=norms, **values)


def _arrow_rows(path: Path) -> pa.Table:
    """The file's rows as Arrow's own stream reader gives them."""
    with pa.ipc.open_stream(pa.py_buffer(path.read_bytes())) as reader:
        return reader.read_all()


def _tail_rows(tail: RunTail) -> pa.Table:
    return pa.Table.from_batches(tail.batches(), schema=tail.schema).combine_chunks()


def _messages(data: bytes) -> list[int]:
    """Where each record batch message of a run file's bytes starts."""
    view, at, found = memoryview(data), 0, []
    while (got := message_at(view, at, "run")) is not None and got[1] != "end":
        if got[1] == "record batch":
            found.append(at)
        at += got[0] + got[2]
    return found


# one row's values; each is drawn from few choices so that runs of steps share a header
_ROWS = st.fixed_dictionaries({
    "loss": st.sampled_from([None, 0.5, 2.0]),
    "scale": st.sampled_from([None, 1024.0]),
    "skipped": st.booleans(),
    "lr": st.sampled_from([[], [1e-3], [1e-3, float("inf")]]),
    "names": st.sampled_from([[], ["ab"], ["cd"], ["ab", "é"]]),
    "param_norm": st.booleans(),
    "finding": st.sampled_from([None, ("nan-loss", "error"), ("lr-spike", "warn")]),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(_ROWS, st.integers(1, 12)), min_size=1, max_size=6),
       world=st.sampled_from([1, 2]))
def test_steps_read_at_once_are_the_rows_arrow_reads(tmp_path, rows, world):
    """Runs of steps (each drawn row repeated 1-12 times, on every rank) read at once or one by one give
    exactly the rows of Arrow's stream reader, nulls, bits, strings and lists included."""
    path = tmp_path / f"alike-{world}.inspect"
    step = 0
    with RunWriter(path, _meta(world)) as writer:
        for values, times in rows:
            for _ in range(times):
                finding = values["finding"]
                writer.write([_record(
                    step, rank, loss=values["loss"] if rank == step % world else 1.0, scale=values["scale"],
                    skipped=values["skipped"] ^ bool(step % 2), lr=values["lr"],
                    scalar_names=values["names"], scalar_values=[float(step)] * len(values["names"]),
                    module_param_norm=np.full(MODULES, 2.0, np.float32) if values["param_norm"] else None,
                    findings=[] if finding is None else [
                        {"code": finding[0], "severity": finding[1], "where": f"m{step % MODULES}",
                         "message": "x" * step}])
                    for rank in range(world)])
                step += 1
    assert _tail_rows(read_all(path)).equals(_arrow_rows(path))


def test_a_followed_run_does_not_decode_its_new_steps_one_by_one(tmp_path, monkeypatch):
    """2,000 steps appended to a followed run (one batch per step, as the watch writes) are read with a
    few Arrow message reads, not one per step: reading cannot fall behind a fast writer by the cost of
    a message per step. The rows are the steps written, in order."""
    calls = []
    real = pa.ipc.read_record_batch
    monkeypatch.setattr(pa.ipc, "read_record_batch", lambda *a, **k: calls.append(1) or real(*a, **k))
    path = tmp_path / "grow.inspect"
    writer = RunWriter(path, _meta())
    try:
        for s in range(1_000):
            writer.write([_record(s)])
        live = LiveRun(path)
        assert len(live.read().steps) == 1_000
        for s in range(1_000, 3_000):
            writer.write([_record(s)])
        run = live.read()
    finally:
        writer.close()
    assert run.steps["step"].tolist() == list(range(3_000))
    assert len(calls) <= 2 * (3_000 // PENDING + 2), f"{len(calls)} messages decoded one at a time"


def _alike_file(tmp_path: Path, steps: int = 12) -> tuple[Path, bytes, list[int]]:
    path = tmp_path / "damaged.inspect"
    with RunWriter(path, _meta()) as writer:
        for s in range(steps):
            writer.write([_record(s, scalar_names=["ab"], scalar_values=[1.0])])
    data = path.read_bytes()
    return path, data, _messages(data)


def test_bad_utf8_in_a_run_of_alike_steps_is_refused_as_when_read_alone(tmp_path):
    path, data, starts = _alike_file(tmp_path)
    at = data.index(b"ab", starts[6])  # step 6's scalar name, same header as its neighbours
    path.write_bytes(data[:at] + b"\xff\xfe" + data[at + 2:])
    with pytest.raises(InspectorError, match=r"damaged\.inspect: a record batch is damaged .*Invalid UTF8"):
        read_all(path)
    assert read_all(data=data[:starts[6]]).rows == 6  # the steps before it read as before


def test_a_forged_list_offset_in_a_run_of_alike_steps_is_refused_as_when_read_alone(tmp_path):
    """Step 6's lr list claims 3 numbers where its header holds one: read at once, it would take its
    neighbour's; it is refused as when read alone."""
    path, data, starts = _alike_file(tmp_path)
    one = np.array([0, 1], "<i4").tobytes()
    header = message_at(memoryview(data), starts[6], "run")[0]
    at = data.index(one, starts[6] + header)  # the first offsets in step 6's body (the lr list's)
    path.write_bytes(data[:at] + np.array([0, 3], "<i4").tobytes() + data[at + len(one):])
    with pytest.raises(InspectorError, match=r"a record batch is damaged .*out of bounds: 3 > 1"):
        read_all(path)
    got = scan(pa.py_buffer(data))  # the intact file: the 12 steps in one run
    assert (got.messages, len(got.batches), got.batches[0].num_rows) == (12, 1, 12)


def test_check_step_rows_read_at_once_are_the_rows_arrow_reads(tmp_path):
    """check_step's rows (its nested ``check`` column: structs, lists, strings) read at once too, and
    give Arrow's rows."""
    import json

    import torch

    from inspector.distributed import check_step
    from inspector.runfiles.stream import append_check

    torch.manual_seed(0)
    record = json.loads(json.dumps(check_step(torch.nn.Linear(2, 1), 0, path=None).record))
    path = tmp_path / "check.inspect"
    for step in range(20):
        append_check(path, dict(record, step=step, time=float(step)))
    got = scan(pa.py_buffer(path.read_bytes()))
    assert (got.messages, len(got.batches)) == (20, 1)
    assert _tail_rows(read_all(path)).equals(_arrow_rows(path))


def _patched(data: bytes, edit) -> bytes:
    """``data`` with ``edit(out, start, size, nodes, buffers)`` applied to every record batch message
    (``out`` a bytearray, ``nodes`` and ``buffers`` where each header entry's two int64 lie in it)."""
    from inspector.runfiles.guard import field_at

    out = bytearray(data)
    for start in _messages(data):
        size, _, _, header, meta = message_at(memoryview(data), start, "run")
        places = []
        for index in (1, 2):  # the field nodes, then the buffers, of the header
            at = field_at(meta, header, index)
            vec = at + struct.unpack_from("<I", meta, at)[0]
            count = struct.unpack_from("<I", meta, vec)[0]
            places.append([start + 8 + vec + 4 + 16 * i for i in range(count)])
        edit(out, start, size, *places)
    return bytes(out)


def _preorder(schema) -> list[tuple[pa.DataType, int]]:
    """Each field node of ``schema``'s batches in Arrow's order, with the index of its first buffer."""
    out: list[tuple[pa.DataType, int]] = []

    def walk(typ: pa.DataType, buffer: int) -> int:
        out.append((typ, buffer))
        if pa.types.is_struct(typ):
            buffer += 1
            for i in range(typ.num_fields):
                buffer = walk(typ.field(i).type, buffer)
            return buffer
        if pa.types.is_list(typ):
            return walk(typ.value_type, buffer + 2)
        return buffer + (3 if pa.types.is_string(typ) else 2)

    buffer = 0
    for field in schema:
        buffer = walk(field.type, buffer)
    return out


def _one_by_one(monkeypatch, data: bytes):
    """What reading ``data`` one message at a time gives: the rows, or the refusal's text."""
    import inspector.runfiles.tail as tail

    with monkeypatch.context() as m:
        m.setattr(tail, "ALIKE_MIN", 1 << 40)
        try:
            return _tail_rows(read_all(data=data))
        except InspectorError as exc:
            return str(exc)


def test_a_header_whose_rows_are_not_its_columns_length_is_refused_as_when_read_alone(tmp_path,
                                                                                       monkeypatch):
    """Every step's header says 2 rows while each column holds 1: read at once, the rows would be taken
    from the columns; it is refused as when each is read alone."""

    from inspector.runfiles.guard import field_at

    _, data, starts = _alike_file(tmp_path)
    header = message_at(memoryview(data), starts[0], "run")

    def two_rows(out, start, size, nodes, buffers):
        struct.pack_into("<q", out, start + 8 + field_at(header[4], header[3], 0), 2)

    forged = _patched(data, two_rows)
    alone = _one_by_one(monkeypatch, forged)
    assert "Array length did not match record batch length" in alone
    with pytest.raises(InspectorError, match="Array length did not match record batch length"):
        read_all(data=forged)


def test_a_null_count_its_bitmap_does_not_bear_out_is_refused_as_when_read_alone(tmp_path, monkeypatch):
    """Every step's loss is null (null count 1); its validity bit forged to 1 in each: read at once, the
    nulls would be counted from the bits and the batch accepted; refused as when read alone."""

    path = tmp_path / "nulls.inspect"
    with RunWriter(path, _meta()) as writer:
        for s in range(8):
            writer.write([_record(s, loss=None)])

    schema = read_all(path).schema
    validity = _preorder(schema)[schema.names.index("loss")][1]  # no nested column before it

    def valid_loss(out, start, size, nodes, buffers):
        out[start + size + struct.unpack_from("<q", out, buffers[validity])[0]] = 1

    forged = _patched(path.read_bytes(), valid_loss)
    assert "null_count value (1) doesn't match" in _one_by_one(monkeypatch, forged)
    with pytest.raises(InspectorError, match=r"null_count value \(1\) doesn't match"):
        read_all(data=forged)


def test_struct_children_longer_than_their_struct_give_arrows_rows(tmp_path, monkeypatch):
    """Each step holds two findings; its header forged to a struct of one finding (children still two
    long, as Arrow allows) and its list to one: Arrow's rows are each step's first finding; read at once,
    step k would take the children's row k."""

    findings = [{"code": c, "severity": "error", "where": "m0", "message": c * 3} for c in ("a", "b")]
    path = tmp_path / "struct.inspect"
    with RunWriter(path, _meta()) as writer:
        for s in range(8):
            writer.write([_record(s, findings=findings)])
    layout = _preorder(read_all(path).schema)
    node = next(i for i, (typ, _) in enumerate(layout) if pa.types.is_struct(typ))  # findings' struct
    offsets = layout[node - 1][1] + 1  # the findings list's offsets buffer, after its validity

    def one_finding(out, start, size, nodes, buffers):
        struct.pack_into("<q", out, nodes[node], 1)  # the struct: 1 long
        at = start + size + struct.unpack_from("<q", out, buffers[offsets])[0]  # the list's offsets
        assert struct.unpack_from("<2i", out, at) == (0, 2)
        struct.pack_into("<2i", out, at, 0, 1)

    forged = _patched(path.read_bytes(), one_finding)
    with pa.ipc.open_stream(pa.py_buffer(forged)) as reader:
        arrow = reader.read_all()
    assert arrow.column("findings").to_pylist() == [findings[:1]] * 8
    assert _one_by_one(monkeypatch, forged).equals(arrow)
    assert _tail_rows(read_all(data=forged)).equals(arrow)


def test_reading_at_once_holds_little_besides_its_copy():
    """512 alike batches of 1,001 rows (a nullable bool, short nullable strings: bitmaps not whole bytes,
    offsets outnumbering characters) read at once: numpy holds at most the copy and half as much again
    (not 8 bytes a bit or 28 an offset), and the rows are Arrow's."""
    import tracemalloc

    from inspector.runfiles.alike import alike, read_alike
    from inspector.runfiles.guard import batch_layout

    rows = 1_001
    schema = pa.schema([("flag", pa.bool_()), ("name", pa.string())])
    batch = pa.record_batch([pa.array([None if i % 3 == 0 else i % 2 == 0 for i in range(rows)]),
                             pa.array([None if i % 5 == 0 else "xy"[: i % 3] for i in range(rows)])],
                            schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for _ in range(512):
            writer.write_batch(batch)
    data = sink.getvalue().to_pybytes()
    view = memoryview(data)
    start = _messages(data)[0]
    size, _, body, header, meta = message_at(view, start, "run")
    count = alike(view, start, size, body, 1 << 20)
    tracemalloc.start()
    try:
        got = read_alike(view, start, count, size, body, rows, *batch_layout(meta, header), schema)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    copy = got.get_total_buffer_size()
    assert count == 512 and peak <= 1.5 * copy, f"{peak:,} bytes held for a copy of {copy:,}"
    assert pa.Table.from_batches([got]).equals(pa.Table.from_batches([batch] * 512).combine_chunks())


def test_batches_of_many_steps_each_read_at_once_are_the_rows_arrow_reads(tmp_path):
    """Batches of up to 64 steps each (consecutive ones of other row counts, so only runs of equal
    batches share a header): runs of 64-step batches are read at once, the rows are Arrow's."""
    path = tmp_path / "many.inspect"
    sizes = [64] * 6 + [17] + [64] * 5 + [3, 5, 64, 64, 1] + [64] * 4
    step = 0
    with RunWriter(path, _meta()) as writer:
        for size in sizes:
            writer.write([_record(step + i, skipped=bool((step + i) % 3)) for i in range(size)])
            step += size
    got = scan(pa.py_buffer(path.read_bytes()))
    assert got.messages == len(sizes)
    assert [b.num_rows for b in got.batches] == [6 * 64, 17, 5 * 64, 3, 5, 64, 64, 1, 4 * 64]
    assert _tail_rows(read_all(path)).equals(_arrow_rows(path))


def test_offsets_that_do_not_start_at_0_give_arrows_rows(tmp_path, monkeypatch):
    """Every step's lr list offsets forged from (0, 1) to (1, 1) and its scalar name's from (0, 2) to
    (1, 2) (valid, as Arrow reads them: no lr, the name "b"): the run is read one by one, Arrow's rows."""

    path, data, _ = _alike_file(tmp_path)
    layout = _preorder(read_all(path).schema)
    names = read_all(path).schema.names
    lr = layout[names.index("lr")][1] + 1  # its offsets buffer, after its validity
    name = layout[names.index("scalar_names") + 2][1] + 1  # the strings' offsets (lr's child before)

    def shifted(out, start, size, nodes, buffers):
        for buffer, was in ((lr, (0, 1)), (name, (0, 2))):
            at = start + size + struct.unpack_from("<q", out, buffers[buffer])[0]
            assert struct.unpack_from("<2i", out, at) == was
            struct.pack_into("<i", out, at, 1)

    forged = _patched(data, shifted)
    with pa.ipc.open_stream(pa.py_buffer(forged)) as reader:
        arrow = reader.read_all()
    assert arrow.column("lr").to_pylist() == [[]] * 12 and arrow.column("scalar_names")[0].as_py() == ["b"]
    assert _tail_rows(read_all(data=forged)).equals(arrow)


def test_a_run_of_alike_steps_cut_anywhere_in_its_last_step_reads_the_whole_ones(tmp_path):
    """A followed run whose writer is mid-step: cut at every byte of its last (alike) step, the steps
    before it are read at once and the cut one waits; appended whole, it is read too."""
    path, data, starts = _alike_file(tmp_path)
    partial = tmp_path / "partial.inspect"
    partial.write_bytes(data[:starts[-1]])
    tail = RunTail(partial)
    assert tail.poll() == 11
    for end in range(starts[-1] + 1, len(data) - 8):  # the last step, less the end-of-stream marker
        cut = RunTail(data=data[:end])
        assert (cut.poll(), cut.cut) == (11, True), end
        with partial.open("ab") as f:
            f.write(data[end - 1:end])
        assert tail.poll() == 0 and tail.cut
    with partial.open("ab") as f:
        f.write(data[len(data) - 9:])
    assert tail.poll() == 1 and not tail.cut
    assert _tail_rows(tail).equals(_arrow_rows(path))


@pytest.fixture(scope="module")
def _varied_steps(tmp_path_factory) -> Path:
    """8 alike steps with a null loss, two lrs, two scalar names and two findings each."""
    path = tmp_path_factory.mktemp("varied") / "varied.inspect"
    findings = [{"code": "a", "severity": "error", "where": "m0", "message": "first"},
                {"code": "bb", "severity": "warn", "where": "m1", "message": "é"}]
    with RunWriter(path, _meta()) as writer:
        for s in range(8):
            writer.write([_record(s, loss=None, skipped=True, lr=[1e-3, 2e-3], scalar_names=["ab", "c"],
                                  scalar_values=[1.0, 2.0], findings=findings, module_param_norm=None)])
    return path


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=st.tuples(st.sampled_from([1, 2]), st.integers(0, 200), st.integers(0, 1),
                       st.sampled_from([0, 1, 2, 3, 4, 7, 8, 9, 16, 24, 40, 64, 200])),
       byte=st.tuples(st.integers(0, 4_000), st.integers(0, 255), st.booleans()),
       forge=st.sampled_from(["header", "body", "both"]))
def test_forged_steps_read_at_once_give_what_one_by_one_gives(monkeypatch, _varied_steps, entry, byte, forge):
    """A header entry (a node's length or null count, a buffer's place or size) forged alike in every
    step, and/or a body byte forged in one step or all: read at once, the file is refused exactly when
    it is refused read one message at a time, and otherwise gives the same rows."""

    data = _varied_steps.read_bytes()
    vector, index, half, value = entry
    at, value_byte, every = byte
    starts = _messages(data)

    def edit(out, start, size, nodes, buffers):
        places = nodes if vector == 1 else buffers
        if forge != "body":
            struct.pack_into("<q", out, places[index % len(places)] + 8 * half, value)
        if forge != "header" and (every or start == starts[3]):
            out[start + size + at % (starts[1] - start - size)] = value_byte

    forged = _patched(data, edit)
    alone = _one_by_one(monkeypatch, forged)
    try:
        at_once = _tail_rows(read_all(data=forged))
    except InspectorError as exc:
        assert isinstance(alone, str), f"refused read at once ({exc}), read alone"
        return
    assert not isinstance(alone, str), f"read at once, refused alone ({alone})"
    assert at_once.equals(alone)


def test_an_empty_column_with_part_of_an_offset_is_refused_as_when_read_alone(tmp_path, monkeypatch):
    """check_step's steps hold empty lists; one's offsets buffer forged to 2 bytes in every step's header
    (Arrow wants none or a whole offset): refused read at once as when read alone."""
    import json

    import torch

    from inspector.distributed import check_step
    from inspector.runfiles.guard import batch_layout
    from inspector.runfiles.stream import append_check

    torch.manual_seed(0)
    record = json.loads(json.dumps(check_step(torch.nn.Linear(2, 1), 0, path=None).record))
    path = tmp_path / "check.inspect"
    for step in range(8):
        append_check(path, dict(record, step=step, time=float(step)))
    data = path.read_bytes()
    _, _, _, header, meta = message_at(memoryview(data), _messages(data)[0], "run")
    nodes, _ = batch_layout(meta, header)
    layout = zip(_preorder(read_all(path).schema), nodes[0::2], strict=True)
    offsets = next(first + 1 for (typ, first), length in layout  # an empty list's offsets buffer
                   if length == 0 and (pa.types.is_list(typ) or pa.types.is_string(typ)))

    def part(out, start, size, nodes, buffers):
        struct.pack_into("<q", out, buffers[offsets] + 8, 2)

    forged = _patched(data, part)
    assert "isn't large enough for length: 0" in _one_by_one(monkeypatch, forged)
    with pytest.raises(InspectorError, match="isn't large enough for length: 0"):
        read_all(data=forged)
