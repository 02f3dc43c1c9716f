"""The per-model lock: a backward pass holds it while the model runs and lets it go afterwards."""

from __future__ import annotations

import threading

from inspector import load_model
from inspector.offsets import run_backward


def other_thread_acquires(lock) -> bool:
    """Whether a second thread can take ``lock`` right now (without waiting); it lets go at once."""
    got = []

    def attempt() -> None:
        ok = lock.acquire(blocking=False)
        got.append(ok)
        if ok:
            lock.release()

    thread = threading.Thread(target=attempt)
    thread.start()
    thread.join()
    return got[0]


def test_run_backward_holds_the_model_lock():
    loaded = load_model("sample:frozen-adapter")
    seen = []
    handle = loaded.model.register_forward_pre_hook(
        lambda m, a: seen.append(other_thread_acquires(loaded.lock)))
    try:
        run_backward(loaded)
    finally:
        handle.remove()
    assert seen == [False]  # held during the forward pass
    assert other_thread_acquires(loaded.lock)  # and let go afterwards
