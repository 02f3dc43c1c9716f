"""The plain data a report is made of: tables, figures as JSON, sections, JSON-safe values."""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..utils.findings import Finding


@dataclass(frozen=True)
class Table:
    """A titled table of plain JSON values (str, int, float, bool, None, lists of those)."""

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    note: str = ""

    @classmethod
    def from_frame(cls, title: str, df: pd.DataFrame, note: str = "") -> Table:
        """A table from a DataFrame (its index is dropped; values made JSON-safe)."""
        columns = tuple(str(c) for c in df.columns)
        rows = tuple(tuple(plain(v) for v in row) for row in df.itertuples(index=False, name=None))
        return cls(title, columns, rows, note)

    @classmethod
    def from_mapping(cls, title: str, data: Mapping[str, Any], note: str = "") -> Table:
        """A two-column ``key, value`` table."""
        return cls(title, ("key", "value"), tuple((str(k), plain(v)) for k, v in data.items()), note)

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "columns": list(self.columns),
                "rows": [list(r) for r in self.rows], "note": self.note}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Table:
        return cls(d["title"], tuple(d["columns"]), tuple(tuple(r) for r in d["rows"]), d.get("note", ""))


@dataclass(frozen=True)
class ReportFigure:
    """An interactive plotly figure (as plain JSON) plus the table that summarises it."""

    title: str
    figure: dict[str, Any] = field(hash=False)
    summary: Table

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "figure": self.figure, "summary": self.summary.to_dict()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReportFigure:
        return cls(d["title"], d["figure"], Table.from_dict(d["summary"]))


@dataclass(frozen=True)
class Section:
    """One part of a report; ``status`` is ``"ok"``, ``"skipped"`` (with a note why) or ``"error"``."""

    id: str
    title: str
    status: str = "ok"
    note: str = ""
    facts: dict[str, Any] = field(default_factory=dict, hash=False)
    tables: tuple[Table, ...] = ()
    figures: tuple[ReportFigure, ...] = ()
    findings: tuple[Finding, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "status": self.status, "note": self.note,
                "facts": dict(self.facts), "tables": [t.to_dict() for t in self.tables],
                "figures": [f.to_dict() for f in self.figures]}



def plain(value: Any, digits: int | None = 8) -> Any:
    """A JSON-safe, stable form of ``value``: floats to ``digits`` significant digits (all of them
    with None), NaN/inf as strings.

    >>> plain(np.float32(0.1)), plain(float("nan")), plain((2, np.int64(3)))
    (0.1, 'nan', [2, 3])
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        x = float(value)
        if math.isnan(x):
            return "nan"
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
        return x if digits is None else float(f"{x:.{digits}g}")
    if isinstance(value, np.ndarray):
        return [plain(v, digits) for v in value.tolist()]
    if isinstance(value, Mapping):
        return {str(k): plain(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [plain(v, digits) for v in items]
    if value is pd.NA or value is pd.NaT:
        return None
    if hasattr(value, "tolist") and callable(value.tolist):  # torch tensors and sizes, numpy scalars
        try:
            return plain(value.tolist(), digits)
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(value)


def _decode_arrays(obj: Any) -> Any:
    """Plotly's ``{"dtype", "bdata"}`` typed arrays decoded to lists, everything made plain."""
    if isinstance(obj, Mapping):
        if "bdata" in obj and "dtype" in obj:
            arr = np.frombuffer(base64.b64decode(obj["bdata"]), dtype=np.dtype(obj["dtype"]))
            shape = obj.get("shape")
            if shape:
                dims = [int(s) for s in str(shape).split(",")] if isinstance(shape, str) else list(shape)
                arr = arr.reshape(dims)
            return plain(arr)
        return {str(k): _decode_arrays(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_decode_arrays(v) for v in obj]
    return plain(obj)


def figure_data(fig: Any) -> dict[str, Any]:
    """A plotly figure as plain JSON (lists, not base64 typed arrays)."""
    raw = fig.to_plotly_json() if hasattr(fig, "to_plotly_json") else dict(fig)
    return _decode_arrays({"data": raw.get("data", []), "layout": raw.get("layout", {})})


def trace_summary(figure: Mapping[str, Any], title: str = "") -> Table:
    """One row per trace: its name, type, number of points and the range of its values."""
    rows = []
    for i, trace in enumerate(figure.get("data", [])):
        values = trace.get("y") if trace.get("orientation") != "h" else trace.get("x")
        if values is None:
            values = trace.get("z", trace.get("values", trace.get("x", [])))
        flat = list(_flatten(values))
        nums = [v for v in flat if isinstance(v, (int, float)) and not isinstance(v, bool)]
        rows.append((trace.get("name") or f"trace {i}", trace.get("type", "scatter"), len(flat),
                     plain(min(nums)) if nums else None, plain(max(nums)) if nums else None))
    return Table(title or "figure", ("trace", "type", "points", "min", "max"), tuple(rows))


def _flatten(values: Any) -> Iterable[Any]:
    if isinstance(values, (list, tuple)):
        for v in values:
            yield from _flatten(v)
    elif values is not None:
        yield values


def make_figure(title: str, fig: Any, summary: Table | pd.DataFrame | None = None) -> ReportFigure:
    """A report figure from a plotly figure; ``summary`` is the table Markdown shows instead.

    Every axis makes room for its tick labels (long module names are not cut at the edge).
    """
    if hasattr(fig, "update_xaxes"):
        from ..figures.palette import readable  # here: the figures package loads plotly

        readable(fig)
    data = figure_data(fig)
    if isinstance(summary, pd.DataFrame):
        summary = Table.from_frame(title, summary)
    return ReportFigure(title, data, summary if summary is not None else trace_summary(data, title))
