"""Placeholder replaced below."""
from __future__ import annotations


def compare_runs(a, b, tolerance=0.05):  # type: ignore[no-untyped-def]
    raise NotImplementedError
