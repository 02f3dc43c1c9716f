"""Pages that run the model first check that it runs here, and say which control to change if not."""

from __future__ import annotations

import streamlit as st

from inspector import LoadedModel
from inspector.loading import RunCheck, try_forward

from .cache import cached_analysis


def advice(check: RunCheck) -> str:
    """What to change in the sidebar when the model cannot run (names the controls people see)."""
    if check.converted:
        return ("Choose **float32** (or **(as built)**) in the sidebar's **Dtype**, or another "
                "device in **Device**, then press **Load model**.")
    return ("Check the model's forward pass and its example inputs, or load another model in the "
            "sidebar.")


def model_runs(loaded: LoadedModel) -> bool:
    """True when ``loaded`` runs a small forward pass; otherwise an ``st.error`` saying what to change.

    The check runs once per loaded model (shared by every session: it depends only on the
    model's dtype and device).
    """
    check = cached_analysis(try_forward, loaded)
    if check.ok:
        return True
    st.error(f"{check.describe()}. {advice(check)}")
    return False
