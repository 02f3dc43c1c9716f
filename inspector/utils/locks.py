"""Per-model locks: anything that adds hooks or runs forward/backward holds one.

A Streamlit server shares cached models between browser sessions, so two sessions
may work on one model object at once. The lock is keyed by the model object itself
(weakly, so it goes away with the model).
"""

from __future__ import annotations

import threading
import weakref

from torch import nn

_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_GUARD = threading.Lock()


def model_lock(model: nn.Module) -> threading.RLock:
    """The re-entrant lock that guards ``model`` (created on first use)."""
    with _GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = threading.RLock()
            _LOCKS[model] = lock
        return lock
