"""Every analysis a page asks for runs within a wall budget and stops once its browser session has gone.

``INSPECTOR_REQUEST_SECONDS`` (default 600) is the budget of one analysis; the library's long loops
(comparing tensors, run files, a report's sections, JSON lines) check it between chunks
(:func:`inspector.utils.work_budget`). A session whose browser left (its tab closed, its connection
lost) is no longer active in Streamlit's runtime: its work stops at the next check, within a quarter
of a second of work, instead of running to the end for nobody.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from inspector import InspectorError
from inspector.utils import WorkStopped, work_budget

_LOG = logging.getLogger("inspector.dashboard")

BUDGET_ENV = "INSPECTOR_REQUEST_SECONDS"
DEFAULT_SECONDS = 600.0


def request_seconds() -> float:
    """The wall budget of one analysis, from ``INSPECTOR_REQUEST_SECONDS``."""
    text = os.environ.get(BUDGET_ENV, "").strip()
    if not text:
        return DEFAULT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise InspectorError(f"{BUDGET_ENV}={text!r} is not a positive number of seconds: set it to e.g. "
                             "600, or unset it for the default")
    return seconds


def session_gone() -> Callable[[], str | None] | None:
    """A check that says why this script's work is for nobody (its browser session has gone), or
    ``None`` outside a served session (AppTest, bare mode)."""
    from streamlit.runtime import Runtime
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None or not Runtime.exists():
        return None
    runtime, session_id = Runtime.instance(), ctx.session_id

    def gone() -> str | None:
        if runtime.is_active_session(session_id):
            return None
        return "the browser session that asked for it has gone (its tab was closed or it lost its connection)"

    return gone


@contextmanager
def request_budget(what: str) -> Iterator[None]:
    """Run the body as one request: within :func:`request_seconds`, stopped when the session goes."""
    advice = (f"Ask for less (fewer sections, one checkpoint at a time), run it from the command line, or "
              f"give the server a larger {BUDGET_ENV}.")
    try:
        with work_budget(request_seconds(), stop_if=session_gone(), what=what, advice=advice):
            yield
    except WorkStopped as stopped:
        _LOG.warning("%s", stopped)  # the server's log says what was stopped, also for a session that left
        raise
