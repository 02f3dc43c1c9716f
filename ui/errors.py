"""Show errors without losing the app: user mistakes as st.error, bugs with a traceback.

Every message passes through :func:`inspector.utils.escaping.markdown_text`: a file name, tensor
name or exception text is shown as the characters it holds, never as Markdown.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from inspector import Finding, InspectorError
from inspector.utils import first_line, markdown_code, markdown_text

log = logging.getLogger("model_inspector.ui")


def show_error(exc: BaseException, what: str = "") -> None:
    """One error on the page: an ``InspectorError`` as its message; anything else as a short
    message naming ``what`` was being done, with the traceback in a collapsed expander (and
    in the server log). A ``sys.exit`` from the model's code counts as a bug, not a stop."""
    if isinstance(exc, InspectorError):
        st.error(markdown_text(exc))
        return
    label = f" while {what}" if what else ""
    text = first_line(exc)
    if isinstance(exc, SystemExit):
        text = f"sys.exit({exc.code!r}) was called; the model's code must return or raise instead"
    log.error("unexpected error%s", label, exc_info=(type(exc), exc, exc.__traceback__))
    st.error(markdown_text(f"Something went wrong{label}: {type(exc).__name__}"
                           + (f": {text}" if text else "")))
    with st.expander("Traceback (for a bug report)"):
        st.code("".join(traceback.format_exception(exc)), language="text")


_installed = False


def install_page_handler() -> None:
    """Make every page's uncaught exception a one-line ``st.error`` with the traceback behind
    an expander, instead of Streamlit's raw traceback. Idempotent; the sidebar calls it.

    Streamlit calls ``streamlit.error_util.show_uncaught_app_exception`` for an exception that
    leaves a page script; it is replaced, for this server process, by a function that shows
    :func:`show_error`'s message and traceback. If drawing that fails, Streamlit's own display runs.
    """
    global _installed
    if _installed:
        return
    from streamlit import error_util

    original = error_util.show_uncaught_app_exception

    def show_uncaught(ex: BaseException) -> None:
        try:
            from streamlit.delta_generator_singletons import get_dg_singleton_instance

            with get_dg_singleton_instance().main_dg:
                show_error(ex, "running this page")
        except Exception:  # noqa: BLE001 - fall back to Streamlit's own display
            original(ex)

    error_util.show_uncaught_app_exception = show_uncaught
    _installed = True


@contextmanager
def guarded(what: str = "") -> Iterator[None]:
    """Run a block; a user's mistake shows st.error, anything else a short message + traceback.

    ``InspectorError`` (bad input: a file, tensor, module or device named with what to do)
    shows its message as it is. Any other exception is a bug: a one-line message naming
    ``what`` was being done, the traceback in a collapsed expander, and the same traceback
    in the server log. Either way the block stops and the rest of the page still renders.
    A ``SystemExit`` raised by model code is shown the same way instead of ending the run.

    Streamlit's own control flow (``st.stop()``, ``st.rerun()``) passes through.
    """
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - the app must stay usable
        show_error(exc, what)
    except SystemExit as exc:
        show_error(exc, what)


def finding_markdown(f: Finding) -> str:
    r"""A finding as one Markdown line: code in bold, the name as code, the message as text.

    >>> print(finding_markdown(Finding("missing-key", "warning", "![k](http://h/x.png)", "x [y](z)")))
    **missing-key** `![k](http://h/x.png)`: x \[y\]\(z\)
    """
    where = f" {markdown_code(f.where)}" if f.where else ""
    return f"**{markdown_text(f.code)}**{where}: {markdown_text(f.message)}"
