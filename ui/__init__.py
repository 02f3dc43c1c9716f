"""Streamlit helpers shared by app.py and the pages.

- :func:`ui.sidebar.model_picker` draws the sidebar picker and returns the selected
  ``LoadedModel``; the choice is ``st.session_state['mi_selection']`` (a
  :class:`ui.models.Selection`, whose ``.key`` names the cached model).
- :func:`ui.cache.cached_analysis` runs an analysis once per model (or per session).
- :func:`ui.errors.guarded` shows a user's mistake as ``st.error`` and a bug with its traceback.
- :func:`ui.tables.paged_table` and :func:`ui.tables.findings_table` keep big tables fast.
- :mod:`ui.flatten_map`, :mod:`ui.device_map` and :mod:`ui.attributions` draw those pages' larger
  sections.
"""
