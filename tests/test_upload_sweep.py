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
