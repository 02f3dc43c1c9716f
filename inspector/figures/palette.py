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

from ..units import bytes_ticks, format_count

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
    """Label a count axis (elements, offsets) in words, ``10 million``, never plotly's ``10B``; returns ``fig``.

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
    """On a log axis spanning a decade or more, one labelled tick per decade (``10⁻³``), never the
    ``2 3 4 … 1 2 3`` of plotly's minor labels; returns ``fig``."""
    finite = [math.log10(v) for v in values if v is not None and v == v and 0 < v < math.inf]
    if finite and max(finite) - min(finite) >= 1:
        (fig.update_xaxes if axis == "x" else fig.update_yaxes)(dtick=1, exponentformat="power", minor_showgrid=False)
    return fig
