"""Sweeping old uploads while entries vanish under it (another server sweeping the same folder)."""

from __future__ import annotations

import os
import time

from ui.uploads import sweep_stale_uploads


def test_an_entry_that_cannot_be_stat_ed_is_skipped_and_the_rest_swept(tmp_path):
    (tmp_path / "gone").symlink_to(tmp_path / "removed-meanwhile")  # stat() raises FileNotFoundError
    old = tmp_path / "old.pt"
    old.write_bytes(b"x")
    hour_ago = time.time() - 7200
    os.utime(old, (hour_ago, hour_ago))
    fresh = tmp_path / "fresh.pt"
    fresh.write_bytes(b"y")
    assert sweep_stale_uploads(tmp_path) == [old]
    assert fresh.exists() and not old.exists()


def _dead_pid() -> int:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    return int(done.stdout)


def _mode(path) -> int:
    return os.lstat(path).st_mode & 0o777


def test_uploads_are_private_to_the_user(tmp_path):
    """Folders 0700 and files 0600 whatever the umask: another local user cannot list or read them."""
    from pathlib import Path

    from ui.uploads import UploadStore

    old = os.umask(0o022)
    try:
        store = UploadStore(tmp_path / "uploads", limit=10**6)
        path = Path(store.save("w.safetensors", b"1234"))
    finally:
        os.umask(old)
    assert _mode(tmp_path / "uploads") == 0o700 and _mode(store.folder) == 0o700 and _mode(path) == 0o600
    store.close()
    assert not store.folder.exists()


def test_the_servers_folder_is_private_and_goes_with_the_server(tmp_path):
    """A real server process: its folder (and the user's folder above it) owner-only, removed at exit."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    code = ("from pathlib import Path; from ui.uploads import UploadStore, upload_dir, upload_base; "
            "s = UploadStore(); p = Path(s.save('w.pt', b'x')); "
            "print(upload_base(), upload_dir(), p, oct(p.stat().st_mode & 0o777), "
            "oct(upload_dir().stat().st_mode & 0o777), oct(upload_base().stat().st_mode & 0o777))")
    env = dict(os.environ, XDG_RUNTIME_DIR=str(runtime), PYTHONPATH=str(root))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    base, server, upload, file_mode, server_mode, base_mode = done.stdout.split()
    assert Path(base) == runtime / f"model-inspector-uploads-{os.getuid()}"
    assert Path(server).parent == Path(base) and Path(upload).is_relative_to(server)
    assert (file_mode, server_mode, base_mode) == ("0o600", "0o700", "0o700")
    assert Path(base).is_dir() and not Path(server).exists()  # removed when the process exited


def test_a_base_held_by_a_link_is_not_used(tmp_path, monkeypatch):
    """Someone else's link at the user's folder name: uploads go to a fresh private folder instead."""
    import shutil

    import ui.uploads as uploads

    runtime, elsewhere = tmp_path / "runtime", tmp_path / "elsewhere"
    runtime.mkdir(mode=0o700)
    elsewhere.mkdir()
    (runtime / f"model-inspector-uploads-{os.getuid()}").symlink_to(elsewhere)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    monkeypatch.setattr(uploads, "_server", None)
    folder = uploads.upload_dir()
    try:
        assert not folder.resolve().is_relative_to(elsewhere) and _mode(folder) == 0o700
        assert not list(elsewhere.iterdir())
    finally:
        shutil.rmtree(folder)


def test_the_sweep_never_follows_a_linked_root(tmp_path):
    """A link in place of the uploads folder: what it points to is not swept (it once was, all of it)."""
    victim = tmp_path / "victim"
    stale = victim / f"{_dead_pid()}-0123"  # named like the folder of a server that has exited
    stale.mkdir(parents=True)
    (stale / "precious.pt").write_bytes(b"x")
    (victim / "old.txt").write_bytes(b"y")
    os.utime(victim / "old.txt", (1e9, 1e9))
    (tmp_path / "uploads").symlink_to(victim)
    assert sweep_stale_uploads(tmp_path / "uploads") == []
    assert (stale / "precious.pt").read_bytes() == b"x" and (victim / "old.txt").exists()


def test_a_link_inside_is_removed_itself_never_what_it_points_to(tmp_path):
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious.pt").write_bytes(b"x")
    root = tmp_path / "uploads"
    root.mkdir(mode=0o700)
    link = root / f"{_dead_pid()}-0123"  # named like a dead server's folder
    link.symlink_to(victim)
    fresh_link = root / "fresh"
    fresh_link.symlink_to(victim)
    os.utime(link, (1e9, 1e9), follow_symlinks=False)
    assert sweep_stale_uploads(root) == [link]
    assert not os.path.lexists(link) and os.path.lexists(fresh_link)
    assert (victim / "precious.pt").read_bytes() == b"x"
