"""Show errors without losing the app: user mistakes as st.error, bugs with a traceback."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from inspector.findings import InspectorError

log = logging.getLogger("model_inspector.ui")


@contextmanager
def guarded(what: str = "") -> Iterator[None]:
    """Run a block; a user's mistake shows st.error, anything else a short message + traceback.

    ``InspectorError`` (bad input: a file, tensor, module or device named with what to do)
    shows its message as it is. Any other exception is a bug: a one-line message naming
    ``what`` was being done, the traceback in a collapsed expander, and the same traceback
    in the server log. Either way the block stops and the rest of the page still renders.

    Streamlit's own control flow (``st.stop()``, ``st.rerun()``) passes through.
    """
    try:
        yield
    except InspectorError as exc:
        st.error(str(exc))
    except Exception as exc:  # noqa: BLE001 - the app must stay usable
        label = f" while {what}" if what else ""
        log.exception("unexpected error%s", label)
        st.error(f"Something went wrong{label}: {type(exc).__name__}: {exc}")
        with st.expander("Traceback (for a bug report)"):
            st.code(traceback.format_exc(), language="text")
