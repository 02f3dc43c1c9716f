"""One colour per device for every figure of the dashboard and the report, and readable axes.

GPU ``n`` (``0``, ``"cuda:0"``) always gets the same colour, ``cpu``, ``disk``, ``mps`` and
``meta`` fixed ones, so a device looks alike in the device-map treemap, the bytes-per-device
bars and the comparison of two plans.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from ..utils.units import bytes_ticks, format_count

GPU_COLOURS = ["#4C78A8", "#F58518", "#54A24B", "#B279A2", "#9D755D", "#72B7B2", "#EECA3B", "#FF9DA6"]
FIXED_COLOURS = {"cpu": "#8C8C8C", "disk": "#5B4636", "mps": "#2CA9B7", "meta": "#D9D9D9",
                 "(none)": "#FFFFFF", "mixed": "#C7C7C7"}
OTHER = "#C7C7C7"
WHOLE_MODEL = "(whole model)"  # accelerate's device-map key "" (the model itself)


def device_key(device: Any) -> str:
    """A device as one spelling: ``0``, ``"0"``, ``"cuda:0"`` -> ``"0"``; None -> ``"(none)"``.

    >>> [device_key(d) for d in (0, "cuda:1", "cpu", None)]
    ['0', '1', 'cpu', '(none)']
    """
    if device is None:
        return "(none)"
    text = str(device).strip()
    m = re.fullmatch(r"(?:cuda:)?(\d+)", text)
    return m.group(1) if m else text


def device_colour(device: Any) -> str:
    """The one colour of ``device`` in every figure.

    >>> device_colour(0) == device_colour("cuda:0") == device_colour("0"), device_colour("cpu")
    (True, '#8C8C8C')
    """
    key = device_key(device)
    if key.isdigit():
        return GPU_COLOURS[int(key) % len(GPU_COLOURS)]
    return FIXED_COLOURS.get(key, OTHER)


def device_colours(devices: Iterable[Any]) -> dict[Any, str]:
    """``{device: colour}`` for several devices (see :func:`device_colour`).

    >>> device_colours([0, "cpu"])
    {0: '#4C78A8', 'cpu': '#8C8C8C'}
    """
    return {d: device_colour(d) for d in devices}


def key_label(key: str) -> str:
    """A device-map key for people: accelerate's ``""`` is the whole model.

    >>> key_label(""), key_label("transformer.h.0")
    ('(whole model)', 'transformer.h.0')
    """
    return WHOLE_MODEL if key == "" else key


def readable(fig: Any) -> Any:
    """Let every axis take the room its tick labels need (long module names are not cut); returns ``fig``."""
    fig.update_xaxes(automargin=True)
    fig.update_yaxes(automargin=True)
    return fig


def bytes_axis(fig: Any, values: Iterable[float | None], axis: str = "y", title: str = "bytes") -> Any:
    """Label a bytes axis in binary units (``10.0 GiB``), the units budgets are given in; returns ``fig``.

    Plotly's own ``~s`` format writes decimal prefixes (40 GiB would read ``43G``).

    >>> import plotly.graph_objects as go
    >>> fig = bytes_axis(go.Figure(go.Bar(y=[40 * 2**30])), [40 * 2**30])
    >>> fig.layout.yaxis.ticktext[:3]
    ('0 B', '10.0 GiB', '20.0 GiB')
    """
    finite = [float(v) for v in values if v is not None and v == v]
    ticks, text = bytes_ticks(max(finite, default=0.0))
    update = fig.update_yaxes if axis == "y" else fig.update_xaxes
    update(tickmode="array", tickvals=ticks, ticktext=text, title_text=title, tickformat=None)
    return fig


def legend_on_top(fig: Any) -> Any:
    """A horizontal legend above the plot, under the title: never over an axis title; returns ``fig``."""
    fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0),
                      title=dict(y=0.98, yanchor="top"), margin=dict(t=90))
    return fig


def whole_ticks(fig: Any, top: float, axis: str = "x") -> Any:
    """Whole-number ticks on an index axis (samples, tokens, steps) from 0 to ``top``: never 0.5.

    >>> import plotly.graph_objects as go
    >>> whole_ticks(go.Figure(), 40, "y").layout.yaxis.dtick
    5
    """
    step = max(1, math.ceil(top / 8)) if top and top > 0 else 1
    step = next((n for n in (1, 2, 5, 10, 20, 25, 50, 100) if n >= step), step)
    (fig.update_xaxes if axis == "x" else fig.update_yaxes)(tick0=0, dtick=step, tickformat="d")
    return fig


def count_axis(fig: Any, top: float, axis: str = "x", title: str = "") -> Any:
    """Label a count axis (elements, offsets) in words, ``10 million``, never plotly's ``10B``; returns
    ``fig``.

    >>> import plotly.graph_objects as go
    >>> count_axis(go.Figure(), 69e9).layout.xaxis.ticktext[:2]
    ('0', '20.0 billion')
    """
    if not top or top <= 0 or not math.isfinite(top):
        return fig
    raw = top / 6
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    ticks = [i * step for i in range(int(top // step) + 1)]
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    update(tickmode="array", tickvals=ticks, ticktext=[format_count(t, exact_below=100_000) for t in ticks],
           **({"title_text": title} if title else {}))
    return fig


def log_decades(fig: Any, values: Iterable[float | None], axis: str = "x") -> Any:
    """Readable ticks on a log axis: one per decade (``10⁻³``) over a decade or more, else 1-2-5 steps
    written out (``0.2``, ``0.5``, ``1``), never the bare ``2 3 4 … 1 2 3`` of minor labels; returns ``fig``.

    >>> import plotly.graph_objects as go
    >>> log_decades(go.Figure(), [0.3, 2.5]).layout.xaxis.ticktext
    ('0.5', '1', '2')
    """
    logs = [math.log10(v) for v in values if v is not None and v == v and 0 < v < math.inf]
    if not logs:
        return fig
    update = fig.update_xaxes if axis == "x" else fig.update_yaxes
    lo, hi = min(logs), max(logs)
    if hi - lo >= 1:
        return update(dtick=1, exponentformat="power")
    ticks = [m * 10.0 ** e for e in range(math.floor(lo) - 1, math.ceil(hi) + 1) for m in (1, 2, 5)
             if lo <= math.log10(m * 10.0 ** e) <= hi]
    if len(ticks) < 2:  # a narrow range: plotly's own ticks are written out in full there
        return fig
    return update(tickmode="array", tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])
