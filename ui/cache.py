"""Cache analyses per loaded model, so switching pages or rerunning does not recompute.

Use it on any page::

    from ui.cache import cached_analysis
    from inspector import offset_map

    loaded = model_picker()
    df = cached_analysis(offset_map, loaded.model, trainable_only=True)

The cache key is the current model's key (``st.session_state['mi_selection'].key``), the
function's module and name, and the other arguments. Arguments may be unhashable: a
``nn.Module``/``LoadedModel`` counts by identity (cached models are one object per key),
a tensor by its shape, dtype and contents, containers element by element, anything else by
``repr``.

Two scopes:

* ``cache_scope="model"`` (default): one result per model for the whole server, shared by
  every browser session. For deterministic analyses of the model's structure or weights
  (alias groups, offset maps, device-map plans, placement tables). Treat the result as
  read-only: ``.copy()`` a DataFrame before changing it.
* ``cache_scope="session"``: one result per browser session (kept in ``st.session_state``).
  For anything that depends on what one user did: captures of their inputs, gradients after
  their backward pass, attributions of their target. Another session never sees it.

Pass ``cache_key=`` to tell apart results that depend on something the arguments do not
show (e.g. a counter bumped after "run a backward pass"), and call :func:`clear_analyses`
after changing the model in place (a re-tie) so nothing stale is shown.

Work that adds hooks or runs forward/backward must still hold ``loaded.lock`` inside ``fn``
(or around the call): the cache only avoids recomputing, it does not serialise.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Literal, TypeVar, cast

import streamlit as st
import torch
from torch import nn

from inspector import LoadedModel

from .models import Selection

T = TypeVar("T")
Scope = Literal["model", "session"]
MAX_SHARED = 12 * 64  # results shared between sessions, all models together (least recently used go first)
MAX_PER_SESSION = 32
_SESSION_KEY = "mi_analyses"


@st.cache_resource(show_spinner=False, max_entries=MAX_SHARED)
def _shared_result(model_key: str, key: tuple, _compute: Callable[[], Any]) -> Any:
    """One result per (model, call) for the whole server.

    Streamlit computes a missing key once (other sessions asking for it meanwhile wait for
    that result), caches nothing when ``_compute`` raises, and drops the least recently used
    results past ``MAX_SHARED``. ``_compute`` is not part of the key (leading underscore).
    """
    _shared_keys(model_key).add(key)
    return _compute()


@st.cache_resource(show_spinner=False)
def _shared_keys(model_key: str) -> set[tuple]:
    """The keys ``_shared_result`` was asked for with ``model_key``, so that one model's results
    can be dropped (:func:`clear_analyses`)."""
    return set()


class _SessionResults:
    """One browser session's results: at most ``MAX_PER_SESSION``, least recently used dropped first."""

    def __init__(self) -> None:
        self.items: OrderedDict[tuple, Any] = OrderedDict()
        self.guard = threading.RLock()  # a session's fragments may run while its script does

    def get_or_compute(self, key: tuple, compute: Callable[[], T]) -> T:
        with self.guard:
            if key in self.items:
                self.items.move_to_end(key)
                return cast(T, self.items[key])
            value = compute()  # an exception propagates and caches nothing
            self.items[key] = value
            while len(self.items) > MAX_PER_SESSION:
                self.items.popitem(last=False)
            return value

    def drop_model(self, model_key: str) -> None:
        with self.guard:
            for k in [k for k in self.items if k[0] == model_key]:
                del self.items[k]


def _session_results() -> _SessionResults:
    store = st.session_state.get(_SESSION_KEY)
    if store is None:
        store = st.session_state[_SESSION_KEY] = _SessionResults()
    return store


def _freeze(value: Any) -> Any:
    """A hashable stand-in for an argument (see the module docstring)."""
    if isinstance(value, (str, int, float, bool, type(None), bytes)):
        return value
    if isinstance(value, LoadedModel):
        return ("loaded", id(value.model))
    if isinstance(value, nn.Module):
        return ("module", id(value))
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.device.type == "meta":
            return ("tensor", tuple(t.shape), str(t.dtype), "meta")
        data = t.cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
        return ("tensor", tuple(t.shape), str(t.dtype), hashlib.sha1(data).hexdigest())
    if isinstance(value, dict):
        return ("dict", tuple((_freeze(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_freeze(v) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted(repr(_freeze(v)) for v in value)))
    if isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    return ("repr", type(value).__qualname__, repr(value))


def _function_id(fn: Callable) -> tuple:
    """Module, qualified name and source line: two lambdas on one page stay apart."""
    code = getattr(fn, "__code__", None)
    where = (code.co_filename, code.co_firstlineno) if code is not None else ()
    return (getattr(fn, "__module__", ""), getattr(fn, "__qualname__", repr(fn)), *where)


def current_model_key() -> str:
    """The key of the model picked in this session (the default model before the picker ran)."""
    sel = st.session_state.get("mi_selection")
    return (sel if isinstance(sel, Selection) else Selection()).key


def cached_analysis(fn: Callable[..., T], /, *args: Any, cache_scope: Scope = "model",
                    cache_key: Any = None, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, computed once per model (or per session) and reused.

    Args:
        fn: the analysis, usually a public ``inspector`` function.
        *args: positional arguments for ``fn`` (a model, a DataFrame, numbers...).
        cache_scope: ``"model"`` shares the result between sessions; ``"session"`` keeps it
            to this browser session (use it for anything built from one user's inputs).
        cache_key: anything extra that makes results differ (hashed like the arguments).
        **kwargs: keyword arguments for ``fn``.

    Returns:
        What ``fn`` returned; the same object on later calls with the same key.
    """
    key = (current_model_key(), _function_id(fn), _freeze(args), _freeze(kwargs), _freeze(cache_key))
    if cache_scope == "session":
        return _session_results().get_or_compute(key, lambda: fn(*args, **kwargs))
    return cast(T, _shared_result(key[0], key, lambda: fn(*args, **kwargs)))


def clear_analyses(model_key: str | None = None) -> None:
    """Forget cached results of one model (default: the current one), shared and this session's.

    Call it after changing the model in place, e.g. after a re-tie or loading new weights.
    """
    model_key = model_key or current_model_key()
    keys = _shared_keys(model_key)
    for key in list(keys):
        _shared_result.clear(model_key, key, None)
        keys.discard(key)
    store = st.session_state.get(_SESSION_KEY)
    if store is not None:
        store.drop_model(model_key)
