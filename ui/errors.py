"""Show errors without losing the app: user mistakes as st.error, bugs with a traceback."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from inspector.findings import InspectorError


@contextmanager
def guarded(what: str = "") -> Iterator[None]:
    """Run a block; a user's mistake shows st.error, anything else a short message + traceback.

    The rest of the page still renders after the block.
    """
    try:
        yield
    except InspectorError as exc:
        st.error(str(exc))
    except Exception as exc:  # noqa: BLE001 - the app must stay usable
        label = f" while {what}" if what else ""
        st.error(f"Something went wrong{label}: {type(exc).__name__}: {exc}")
        with st.expander("Traceback"):
            st.code(traceback.format_exc())
