"""The one path gate (``inspector.utils.paths.confined``) and the regular-file check: paths out of the
allowed folders, ``..``, ``%2e%2e``, NUL, symlinks leading out, FIFOs and devices are refused with a
message naming the path, before anything opens them; the pages stay usable afterwards."""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from streamlit.testing.v1 import AppTest

from inspector import InspectorError, compare
from inspector.loading import checkpoint_listing, read_checkpoint
from inspector.utils import confined, file_kind, regular_file
from inspector.watching import read_captures
from tests.apptest import PAGES
from tests.test_watch_captures import _run as watched_run

HOSTILE = ["/etc/shadow", "../outside/secret.inspect", "a/../../outside/secret.inspect", "link.inspect",
           "linkdir/secret.inspect", "a\x00b", "/"]
# Percent escapes are not decoded (an address's are, before the page sees them): `%2e%2e` names a
# folder of that name inside the runs folder, which is not there.
ESCAPED = ["%2e%2e/outside/secret.inspect", "%2e%2e%2foutside%2fsecret.inspect"]


@pytest.fixture
def runs(tmp_path):
    """A runs folder with one watched run (its producer captured), and links out of it."""
    root = tmp_path / "runs"
    root.mkdir()
    watched_run(root / "good.inspect")
    outside = tmp_path / "outside"
    outside.mkdir()
    watched_run(outside / "secret.inspect")
    (root / "link.inspect").symlink_to(outside / "secret.inspect")
    (root / "linkdir").symlink_to(outside, target_is_directory=True)
    return root


# ------------------------------------------------------------------------------------ the gate itself
@pytest.mark.parametrize("typed", HOSTILE)
def test_the_gate_refuses_what_leads_out(runs, typed):
    with pytest.raises(InspectorError, match="is not under the allowed folders"):
        confined(typed, [runs])


@pytest.mark.parametrize("typed", ESCAPED)
def test_percent_escapes_name_nothing_outside(runs, typed):
    with pytest.raises(InspectorError, match=re.escape(f"file {typed} does not exist")):
        confined(typed, [runs])


def test_the_gate_takes_what_lies_inside(runs, tmp_path):
    good = (runs / "good.inspect").resolve()
    assert confined("good.inspect", [runs]) == good
    assert confined(str(runs / "good.inspect"), [runs]) == good
    assert confined(f"  {runs}/sub/../good.inspect ", [runs]) == good  # `..` that stays inside
    inner = runs / "alias.inspect"
    inner.symlink_to(runs / "good.inspect")  # a link inside the folder, to a file inside it
    assert confined(str(inner), [runs]) == good
    assert confined(str(runs), [runs], kind="folder") == runs.resolve()
    with pytest.raises(InspectorError, match="is not a folder"):
        confined("good.inspect", [runs], kind="folder")
    with pytest.raises(InspectorError, match="is a folder; give the path of a file"):
        confined(str(runs), [runs])


def test_out_of_the_folders_nothing_tells_whether_a_file_exists(runs):
    """The same words for /etc/shadow and for a file that is nowhere: nothing outside can be probed."""
    def refused(typed: str) -> str:
        with pytest.raises(InspectorError) as info:
            confined(typed, [runs])
        return str(info.value).replace(typed, "PATH")

    assert refused("/etc/shadow") == refused("/etc/no-such-file-anywhere") == refused("/nowhere/at/all")


@pytest.mark.timeout(30)
def test_fifos_and_devices_are_refused_before_opening(runs):
    fifo = runs / "pipe.inspect"
    os.mkfifo(fifo)
    assert file_kind(fifo) == "a FIFO (named pipe)" and file_kind("/dev/null") == "a character device"
    with pytest.raises(InspectorError, match=r"pipe.inspect is a FIFO \(named pipe\), not a regular file"):
        confined("pipe.inspect", [runs])
    with pytest.raises(InspectorError, match="is a FIFO"):
        regular_file(fifo)
    with pytest.raises(InspectorError, match="/dev/zero is a character device"):
        confined("/dev/zero", None)  # no folders to stay in: still a regular file or nothing
    with pytest.raises(InspectorError, match="NUL"):
        confined("a\x00b", None)


def _folders(tmp_path: Path, *names: str) -> list[Path]:
    made = [tmp_path / n for n in names]
    for folder in made:
        folder.mkdir()
    return made


def test_a_relative_path_is_looked_for_in_the_next_folder_when_the_first_leads_out(tmp_path):
    """Each allowed folder in turn: one where the name is a link out of it is passed over, and the
    search goes on to the next folder (it does not end there)."""
    out, first, second = _folders(tmp_path, "out", "first", "second")
    (out / "run.inspect").write_text("outside")
    (second / "run.inspect").write_text("inside")
    (first / "run.inspect").symlink_to(out / "run.inspect")
    assert confined("run.inspect", [first, second]) == (second / "run.inspect").resolve()
    with pytest.raises(InspectorError, match="is not under the allowed folders"):
        confined("run.inspect", [first])


@pytest.mark.skipif(sys.version_info >= (3, 13), reason="resolve() raises on a loop before 3.13")
def test_a_relative_path_is_looked_for_in_the_next_folder_when_the_first_holds_a_loop(tmp_path):
    first, second = _folders(tmp_path, "first", "second")
    (first / "run.inspect").symlink_to(first / "run.inspect")  # a link to itself: resolving it raises
    (second / "run.inspect").write_text("inside")
    assert confined("run.inspect", [first, second]) == (second / "run.inspect").resolve()


def test_with_no_allowed_folder_an_absolute_path_in_the_extra_folder_is_taken(tmp_path):
    """A server with no data folders still opens its uploads: ``extra`` holds for absolute paths."""
    uploads, elsewhere = _folders(tmp_path, "uploads", "elsewhere")
    (uploads / "model.pt").write_text("x")
    (elsewhere / "model.pt").write_text("x")
    assert confined(str(uploads / "model.pt"), [], extra=[uploads]) == (uploads / "model.pt").resolve()
    with pytest.raises(InspectorError, match="is not under the allowed folders"):
        confined(str(elsewhere / "model.pt"), [], extra=[uploads])
    with pytest.raises(InspectorError, match="is not under the allowed folders"):
        confined("model.pt", [], extra=[uploads])  # extra is never searched


def test_no_path_at_all_is_an_empty_path(tmp_path):
    """A text field with nothing typed gives None: refused in words, not with a TypeError."""
    assert _refusal(lambda: confined(None)) == "the file path is empty; give a path"
    assert _refusal(lambda: confined(None, [tmp_path])) == f"'' is not under the allowed folders ({tmp_path})"


# ----------------------------------------------------------------------------- shards named by an index
def _folder(path: Path, shard: Path | None = None) -> Path:
    path.mkdir()
    name = "model-00001-of-00001.safetensors"
    if shard is None:
        save_file({"w": torch.ones(2)}, path / name)
    else:
        (path / name).symlink_to(shard)
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": name}}))
    return path


def test_a_shard_linked_out_of_its_folder_is_refused_naming_it(tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    save_file({"w": torch.full((2,), 7.0)}, outside)
    linked = _folder(tmp_path / "linked", outside)
    shard = re.escape("'model-00001-of-00001.safetensors', a link that leads outside")
    with pytest.raises(InspectorError, match=shard):
        checkpoint_listing(linked)
    with pytest.raises(InspectorError, match=shard):
        read_checkpoint(linked)
    with pytest.raises(InspectorError, match=shard):
        compare(str(_folder(tmp_path / "plain")), str(linked))
    # a link to a file inside the folder is a shard of it
    inside = _folder(tmp_path / "inside", None)
    (inside / "model-00001-of-00001.safetensors").rename(inside / "real.safetensors")
    (inside / "model-00001-of-00001.safetensors").symlink_to(inside / "real.safetensors")
    state, _ = read_checkpoint(inside)
    assert state["w"].tolist() == [1.0, 1.0]


@pytest.mark.timeout(30)
def test_a_fifo_shard_is_refused_naming_it(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    os.mkfifo(folder / "model-00001-of-00001.safetensors")
    (folder / "model.safetensors.index.json").write_text(
        '{"weight_map": {"w": "model-00001-of-00001.safetensors"}}')
    with pytest.raises(InspectorError, match=r"shard 'model-00001-of-00001.safetensors', which is a FIFO"):
        read_checkpoint(folder)


# ------------------------------------------------------------------------------ the commands and FIFOs
@pytest.fixture
def pipes(tmp_path):
    for name in ("w.safetensors", "w.pt", "run.inspect"):
        os.mkfifo(tmp_path / name)
    save_file({"w": torch.ones(2)}, tmp_path / "a.safetensors")
    return tmp_path


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv, named", [
    (["checkpoint", "{d}/w.safetensors"], "w.safetensors is a FIFO"),
    (["checkpoint", "/dev/zero"], "/dev/zero is a character device"),
    (["compare", "{d}/w.safetensors", "{d}/a.safetensors"], "w.safetensors is a FIFO"),
    (["compare", "{d}/a.safetensors", "{d}/w.pt"], "w.pt is a FIFO"),
    (["compare", "{d}/run.inspect", "{d}/run.inspect"], "run.inspect is a FIFO"),
    (["compare", "{d}/a.safetensors", "/dev/zero"], "/dev/zero is a character device"),
    (["report", "{d}/run.inspect", "-o", "{d}/r.json"], "run.inspect is a FIFO"),
    (["report", "sample:tiny-gpt2", "--checkpoint", "{d}/w.pt", "-o", "{d}/r.json"], "w.pt is a FIFO"),
])
def test_commands_refuse_a_fifo_or_device_before_opening(run_cli, pipes, argv, named):
    status, out, err = run_cli([a.format(d=pipes) for a in argv])
    assert status == 2, (out, err)
    assert named in err and "not a regular file" in err and "Traceback" not in err


# --------------------------------------------------------------------------- the pages
def _page(page: str, runs: Path, monkeypatch) -> AppTest:
    monkeypatch.setenv("INSPECTOR_RUNS", str(runs))
    at = AppTest.from_file(str(PAGES / page), default_timeout=120)
    return at.run()


def _errors(at: AppTest) -> str:
    return " ".join(e.value for e in at.error).replace("\\", "")  # as the Markdown reads


@pytest.mark.timeout(300)
def test_hook_captures_page_refuses_paths_out_of_the_runs_folders(runs, monkeypatch):
    """The "Captures of a watched run" field: /etc/shadow, ../, %2e%2e, NUL and links out are refused
    naming --runs (never "does not exist" for a file outside); a FIFO as the run's captures file is
    refused without blocking; the page then reads a good run."""
    os.mkfifo(runs / "piped.inspect.captures.safetensors")
    (runs / "piped.inspect").write_bytes((runs / "good.inspect").read_bytes())
    at = _page("4_Hook_captures.py", runs, monkeypatch)
    assert not at.exception
    for typed in [*HOSTILE, *ESCAPED, "/etc/no-such-file"]:
        at.text_input(key="cap_run_path").input(typed).run()
        assert not at.exception, typed
        text = _errors(at)
        if typed in ESCAPED:
            assert "does not exist" in text, (typed, text)
            continue
        assert "--runs" in text and "not under the runs folders" in text, (typed, text)
        assert "does not exist" not in text and "secret" not in text.replace(typed, ""), (typed, text)
    at.text_input(key="cap_run_path").input("piped.inspect").run()
    assert not at.exception
    assert "piped.inspect.captures.safetensors is a FIFO (named pipe), not a regular file" in _errors(at)
    at.text_input(key="cap_run_path").input("good.inspect").run()
    assert not at.exception and not at.error
    assert any("at step **2**" in m.value for m in at.markdown)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("page, key", [("8_Training.py", "train_path"), ("9_Compare.py", "cmp_run_path_A")])
def test_run_paths_on_training_and_compare_are_refused_and_fifos_never_block(runs, monkeypatch, page, key):
    os.mkfifo(runs / "pipe.data")  # a name the runs listing passes over: only the typed path opens it
    at = _page(page, runs, monkeypatch)
    if page == "9_Compare.py":
        at.radio(key="cmp_mode").set_value("two run files").run()
    for typed in ["/etc/shadow", "../outside/secret.inspect", "link.inspect"]:
        at.text_input(key=key).input(typed).run()
        assert not at.exception, typed
        assert "not under the runs folders" in _errors(at), (typed, _errors(at))
    at.text_input(key=key).input("pipe.data").run()
    assert not at.exception
    assert "pipe.data is a FIFO (named pipe), not a regular file" in _errors(at)
    at.text_input(key=key).input("good.inspect").run()
    assert not at.exception and "FIFO" not in _errors(at) and "not under" not in _errors(at)


@pytest.mark.timeout(300)
def test_an_address_with_dot_dot_opens_nothing_outside(runs, monkeypatch):
    """``?run=%2e%2e/outside/secret.inspect`` reaches the page decoded, as ``../outside/...``."""
    monkeypatch.setenv("INSPECTOR_RUNS", str(runs))
    at = AppTest.from_file(str(PAGES / "8_Training.py"), default_timeout=120)
    at.query_params["run"] = "../outside/secret.inspect"
    at.run()
    assert not at.exception and "not under the runs folders" in _errors(at)


@pytest.mark.timeout(300)
def test_checkpoint_paths_pass_the_gate_on_the_sidebar_and_compare(tmp_path, monkeypatch):
    """With INSPECTOR_DATA_DIRS set, a checkpoint outside it is refused on load and as Compare's B; a
    FIFO is refused either way; the previous model stays."""
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "pipe.safetensors")
    monkeypatch.setenv("INSPECTOR_DATA_DIRS", str(data))
    at = AppTest.from_file(str(PAGES / "9_Compare.py"), default_timeout=120).run()
    for typed, needle in [("/etc/shadow", "not under the data folders"),
                          (f"{data}/../data/../../etc/shadow", "not under the data folders"),
                          (str(data / "pipe.safetensors"), "pipe.safetensors is a FIFO")]:
        at.text_input(key="cmp_b").input(typed).run()
        assert not at.exception and needle in _errors(at), (typed, _errors(at))
        at.text_input(key="mi_ckpt_path").input(typed).run()
        at.button(key="mi_load").click().run()
        assert not at.exception and needle in _errors(at), (typed, _errors(at))
        assert at.session_state["mi_selection"].checkpoint is None
    monkeypatch.delenv("INSPECTOR_DATA_DIRS")
    at.text_input(key="mi_ckpt_path").input(str(data / "pipe.safetensors")).run()
    at.button(key="mi_load").click().run()
    assert not at.exception and "pipe.safetensors is a FIFO" in _errors(at)


@pytest.mark.timeout(60)
def test_read_captures_refuses_a_fifo_and_a_link_out(runs, tmp_path):
    os.mkfifo(runs / "p.inspect")
    with pytest.raises(InspectorError, match="run file .*p.inspect is a FIFO"):
        read_captures(runs / "p.inspect")
    (runs / "l.inspect").write_bytes((runs / "good.inspect").read_bytes())
    secret = tmp_path / "outside" / "secret.inspect.captures.safetensors"
    (runs / "l.inspect.captures.safetensors").symlink_to(secret)
    with pytest.raises(InspectorError, match="leads outside"):
        read_captures(runs / "l.inspect")


def test_an_upload_is_stored_under_a_plain_name_inside_its_folder(tmp_path):
    from ui.uploads import UploadStore

    store = UploadStore(tmp_path / "uploads", limit=10**6)
    for name in ["a\x00.pt", "../../x.pt", "a\nb.pt", "ev\u202eil.pt", "a\\b.pt", "/etc/y.pt"]:
        path = Path(store.save(name, name.encode("utf-8", "surrogateescape")))
        assert path.parent == store.folder.resolve() and path.is_file(), name
        assert not set(path.name) & set("\x00\n\u202e\\/"), path.name
    with pytest.raises(InspectorError, match="is not a checkpoint"):
        store.save("..", b"1")
    store.close()


@pytest.mark.timeout(60)
def test_a_fifo_piece_of_a_distributed_checkpoint_is_refused(tmp_path):
    from tests.hostile_loading import _dcp_save

    folder = tmp_path / "dcp"
    _dcp_save(folder, {"w": torch.ones(4)})
    piece = next(p for p in folder.iterdir() if p.suffix == ".distcp")
    piece.unlink()
    os.mkfifo(piece)
    with pytest.raises(InspectorError, match=re.escape(f"dcp piece {piece.resolve()} is a FIFO")):
        read_checkpoint(folder)


# --------------------------------------------------------------------------------------------
# Each refusal's whole message: what the path is, and what to give instead


def _refusal(call) -> str:
    with pytest.raises(InspectorError) as err:
        call()
    return str(err.value)


def test_each_refusal_says_what_the_path_is_and_what_to_give(tmp_path):
    (tmp_path / "a.txt").write_text("x")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert _refusal(lambda: regular_file(tmp_path / "gone")) == \
        f"file {tmp_path / 'gone'} does not exist; give the path of an existing file"
    assert _refusal(lambda: regular_file(tmp_path, "checkpoint")) == \
        f"checkpoint {tmp_path} is a folder; give the path of a file"
    assert _refusal(lambda: regular_file(fifo)) == (
        f"file {fifo} is a FIFO (named pipe), not a regular file; reading it could block or never end: "
        "give a regular file")
    assert _refusal(lambda: confined("  ")) == "the file path is empty; give a path"
    assert _refusal(lambda: confined("", [tmp_path])) == f"'' is not under the allowed folders ({tmp_path})"
    assert _refusal(lambda: confined("a\x00b", [tmp_path])) == \
        f"'a\\x00b' is not under the allowed folders ({tmp_path})"
    assert _refusal(lambda: confined("/etc/passwd", [tmp_path, tmp_path / "x"])) == \
        f"/etc/passwd is not under the allowed folders ({tmp_path}, {tmp_path / 'x'})"
    assert _refusal(lambda: confined("/etc/passwd", [])) == \
        "/etc/passwd is not under the allowed folders (none is configured)"
    assert _refusal(lambda: confined("/etc/passwd", [tmp_path], refusal=lambda t: f"no: {t}")) == \
        "no: /etc/passwd"
    assert _refusal(lambda: confined(str(tmp_path), [tmp_path.parent])) == \
        f"file {tmp_path} is a folder; give the path of a file"
    assert _refusal(lambda: confined(str(fifo), what="run file")).startswith(f"run file {fifo} is a FIFO")
    assert _refusal(lambda: confined("a.txt", [tmp_path], kind="folder", what="runs folder")) == \
        "runs folder a.txt is not a folder; give a folder"
    assert confined("a.txt", [tmp_path], kind="any") == (tmp_path / "a.txt").resolve()
    assert confined(str(tmp_path), [tmp_path.parent], kind="any") == tmp_path.resolve()
    assert _refusal(lambda: confined(tmp_path / "gone.txt", [tmp_path])) == \
        "file " + str(tmp_path / "gone.txt") + " does not exist; give the path of an existing file"
    assert _refusal(lambda: confined("gone", [tmp_path], kind="folder", what="runs folder")) == \
        "runs folder gone does not exist; give the path of an existing folder"


def test_a_special_file_of_no_known_kind_is_named_so():
    # /dev/null is a character device; a path that is not there, or a regular file, is no special file
    assert file_kind("/dev/null") == "a character device"
    assert file_kind("/no/such/path") is None and file_kind(__file__) is None
