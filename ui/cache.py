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

Every computation runs as one request (:func:`ui.budget.request_budget`): within the server's wall
budget, and stopped once the browser session that asked for it has gone; a stopped one caches nothing.

Both scopes keep their results in one kind of store, :class:`_Results`: a least-recently-used
map with one computation per key. Streamlit's ``st.cache_resource`` (``max_entries``, even with
``scope="session"``) is not used for the results because it cannot list or drop the entries of
one model: :func:`clear_analyses` must forget exactly one model's results, at once, and free
their memory. ``st.cache_resource`` only holds the process's one shared store.
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

from .budget import request_budget
from .models import Selection

T = TypeVar("T")
Scope = Literal["model", "session"]
MAX_SHARED = 12 * 64  # results shared between sessions, all models together (least recently used go first)
MAX_PER_SESSION = 32
_SESSION_KEY = "mi_analyses"


class _Results:
    """At most ``limit`` results, least recently used dropped first; keys start with the model key.

    A missing key is computed once: callers asking for the same key meanwhile (other sessions,
    or a session's fragments while its script runs) wait for that result; other keys do not
    wait. A computation that raises caches nothing.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: OrderedDict[tuple, Any] = OrderedDict()
        self.guard = threading.Lock()
        self.computing: dict[tuple, threading.RLock] = {}

    def _get(self, key: tuple) -> tuple[bool, Any]:
        with self.guard:
            if key in self.items:
                self.items.move_to_end(key)
                return True, self.items[key]
            return False, None

    def get_or_compute(self, key: tuple, compute: Callable[[], T]) -> T:
        found, value = self._get(key)
        if found:
            return cast(T, value)
        with self.guard:
            key_lock = self.computing.setdefault(key, threading.RLock())
        with key_lock:
            found, value = self._get(key)  # computed while this caller waited
            if found:
                return cast(T, value)
            try:
                value = compute()
                with self.guard:
                    self.items[key] = value
                    while len(self.items) > self.limit:
                        self.items.popitem(last=False)
            finally:
                with self.guard:
                    self.computing.pop(key, None)
            return value

    def drop_model(self, model_key: str) -> None:
        with self.guard:
            for k in [k for k in self.items if k[0] == model_key]:
                del self.items[k]


@st.cache_resource(show_spinner=False)
def _shared_results() -> _Results:
    """The process's one store of results shared between sessions."""
    return _Results(MAX_SHARED)


def shared_key_count() -> int:
    """How many shared results this process holds (at most ``MAX_SHARED``)."""
    return len(_shared_results().items)


def _session_results() -> _Results:
    store = st.session_state.get(_SESSION_KEY)
    if store is None:
        store = st.session_state[_SESSION_KEY] = _Results(MAX_PER_SESSION)
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
    store = _session_results() if cache_scope == "session" else _shared_results()
    what = getattr(fn, "__name__", "the analysis")
    what = f"{what}()" if what.isidentifier() else "the analysis"

    def compute() -> T:
        with request_budget(what):
            return fn(*args, **kwargs)

    return store.get_or_compute(key, compute)


def clear_analyses(model_key: str | None = None) -> None:
    """Forget cached results of one model (default: the current one), shared and this session's.

    Call it after changing the model in place, e.g. after a re-tie or loading new weights.
    """
    model_key = model_key or current_model_key()
    _shared_results().drop_model(model_key)
    store = st.session_state.get(_SESSION_KEY)
    if store is not None:
        store.drop_model(model_key)
