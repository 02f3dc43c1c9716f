"""Running one dashboard page with Streamlit's AppTest."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from ui.models import Selection

PAGES = Path(__file__).resolve().parent.parent / "pages"


def run_page(page: str, source: str | None = None, timeout: float = 60,
             query: dict[str, str] | None = None) -> AppTest:
    """Run ``pages/<page>`` once and fail on any exception.

    ``source`` selects a model through the session; ``query`` sets URL parameters instead
    (``{"model": ..., "device": ...}``), as a shared link would.
    """
    at = AppTest.from_file(str(PAGES / page), default_timeout=timeout)
    if source is not None:
        at.session_state["mi_selection"] = Selection(source=source)
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def run_in_app(page: str, source: str | None = None, timeout: float = 120,
               query: dict[str, str] | None = None) -> AppTest:
    """Run ``app.py`` (its navigation), then ``pages/<page>`` in it, as a browser that opened the app does:
    a page that switches to another (``st.switch_page``) finds it there, unlike a page run on its own."""
    at = AppTest.from_file(str(PAGES.parent / "app.py"), default_timeout=timeout)
    if source is not None:
        at.session_state["mi_selection"] = Selection(source=source)
    at.run()
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.switch_page(f"pages/{page}").run()
    assert not at.exception, [e.value for e in at.exception]
    return at
