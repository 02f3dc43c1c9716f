"""Names from a model or a file are data: escape them for Markdown and for plotly text.

Parameter, module, buffer and checkpoint-key names are chosen by whoever wrote the model
or the file. Anything that renders Markdown (Streamlit's ``st.markdown``/``st.warning``/...,
Markdown reports) or plotly's HTML subset (labels, hover text, titles) must show them as
text, never as a link, an image or markup. Four helpers, used everywhere a name is shown:

* :func:`markdown_text` for a name (or a sentence holding names) inside Markdown prose;
* :func:`markdown_code` for a name shown as inline code;
* :func:`plot_text` for a name in plotly text (see also :func:`escape_figure`);
* :func:`terminal_text` for the command line, :func:`terminal_line` for a name inside one line of it;
* :func:`grid_text` / :func:`grid_frame` for the cells of a data grid (the dashboard's tables);
* :func:`tensorboard_text` for TensorBoard's text panel, which renders Markdown and shows images.

Characters that move or hide text rather than show it (C0/C1 controls such as ESC and NUL,
the bidirectional overrides such as RTL-override U+202E, lone surrogates) are written as
visible ``\x1b`` / ``\u202e`` escapes by all of them (see :func:`visible_text`), so a name
cannot reorder, hide or restyle what is around it in a terminal, a report or a figure;
:func:`json_visible` does the same, losslessly, for JSON text.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import numpy as np

# Marks that start Markdown (or Streamlit) syntax anywhere in a line. `_` only at a word's edge
# (GFM never reads an underscore inside a word as emphasis); `.` only after `www` and `:` only
# before `/` or after mailto/xmpp (the autolinks GFM makes of bare text).
_MARKS = re.compile(r"([\\`*\[\]()!|~$@#{}]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])|(?<=\bwww)\."
                    r"|:(?=/)|(?<=mailto):|(?<=xmpp):)", re.IGNORECASE)
_BLOCK_START = re.compile(r"^(\s*)([-+=])|^(\s*\d+)([.)])")
_LINE_BREAKS = re.compile(r"[\r\n\u2028\u2029\x0b\x0c]+")
_BACKTICKS = re.compile(r"`+")


# Controls (but tab and newline), DEL and C1, the bidirectional marks, embeddings, overrides and
# isolates, and lone surrogates (which no UTF-8 file can hold).
_HIDDEN = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_INVISIBLE = re.compile(f"[{_HIDDEN}]")
_INVISIBLE_OR_BREAK = re.compile(f"[{_HIDDEN}\t\n]")
_INVISIBLE_OR_ANY_BREAK = re.compile(f"[{_HIDDEN}\t\n\u2028\u2029]")


def _escape_char(m: re.Match[str]) -> str:
    code = ord(m.group())
    if 0xDC80 <= code <= 0xDCFF:  # a byte of a file name that is not UTF-8, as Python reads it: show the byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible_text(value: Any, keep_lines: bool = False) -> str:
    r"""``value`` with every control, bidirectional-override and lone-surrogate character written
    as a visible escape (``\x1b``, ``\x00``, ``\u202e``); tab and newline too unless ``keep_lines``.

    >>> print(visible_text("evil\u202eexe.pt\x00\x1b[2J"))
    evil\u202eexe.pt\x00\x1b[2J
    """
    pattern = _INVISIBLE if keep_lines else _INVISIBLE_OR_BREAK
    return pattern.sub(_escape_char, "" if value is None else str(value))


def json_visible(text: str) -> str:
    r"""JSON text with those characters as JSON ``\uXXXX`` escapes: the same data, shown safely.

    >>> json_visible('{"k": "a\u202eb"}')
    '{"k": "a\\u202eb"}'
    """
    return _INVISIBLE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def markdown_text(value: Any) -> str:
    r"""``value`` as literal text inside Markdown (CommonMark/GFM, Streamlit's ``st.markdown``).

    ``<``, ``>`` and ``&`` become entities; the marks that start a link, an image, emphasis,
    code, a table cell, a Streamlit directive (``:red[...]``), LaTeX or an autolink
    (``http://``, ``www.``, ``a@b``) are backslash-escaped; line breaks become spaces
    so a name cannot start a new block. Rendered, the text reads exactly as ``value``.

    >>> print(markdown_text("![k](http://h/x.png)"))
    \!\[k\]\(http\://h/x.png\)
    >>> print(markdown_text("<b>a|b</b> parameter_elements"))
    &lt;b&gt;a\|b&lt;/b&gt; parameter_elements
    >>> print(markdown_text("1. x"))
    1\. x
    """
    text = visible_text(_LINE_BREAKS.sub(" ", "" if value is None else str(value)), keep_lines=True)
    text = html.escape(text, quote=False)
    text = _MARKS.sub(r"\\\1", text)
    return _BLOCK_START.sub(lambda m: f"{m[1]}\\{m[2]}" if m[2] else f"{m[3]}\\{m[4]}", text, count=1)


def markdown_code(value: Any) -> str:
    """``value`` as one inline code span, whatever backticks it holds (CommonMark's rule).

    >>> markdown_code("lm_head.weight")
    '`lm_head.weight`'
    >>> markdown_code("a`b")
    '``a`b``'
    """
    text = visible_text(_LINE_BREAKS.sub(" ", "" if value is None else str(value)), keep_lines=True)
    if not text:
        return "` `"
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text[0] in "` " or text[-1] in "` " else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def plot_text(value: Any) -> str:
    """``value`` for plotly's text (labels, hover, titles): ``<``, ``>`` and ``&`` as entities.

    Plotly draws ``<a href>``, ``<br>``, ``<b>``... in any text it shows; the entities it
    decodes back are shown as the characters.

    >>> plot_text('<a href="http://h">x</a> & y')
    '&lt;a href="http://h"&gt;x&lt;/a&gt; &amp; y'
    """
    return html.escape(visible_text(value), quote=False)


# Trace and layout fields that only ever carry data (names, categories), never markup we write.
_TRACE_FIELDS = ("x", "y", "ids", "parents", "labels", "text", "customdata", "name")
_AXIS_FIELDS = ("categoryarray", "tickvals")


def _escape_values(values: Any) -> Any:
    if values is None:
        return None
    if isinstance(values, str):
        return plot_text(values)
    if isinstance(values, np.ndarray):
        if values.dtype.kind in "OUS":
            return np.vectorize(_escape_values, otypes=[object])(values) if values.size else values
        return values
    if isinstance(values, (list, tuple)):
        return type(values)(_escape_values(v) for v in values)
    return values


def escape_figure(fig: Any) -> Any:
    """Escape, in place, every data string of a plotly figure; returns the figure.

    Covers each trace's ``x``, ``y``, ``ids``, ``parents``, ``labels``, ``text``,
    ``customdata`` and ``name``, the layout's title, every axis title and category array.
    Hover texts, tick texts and annotations, which hold markup the builders write
    (``<br>``, ``<b>``), are escaped where each name enters them, with :func:`plot_text`.
    """
    for trace in fig.data:
        for key in _TRACE_FIELDS:
            if key in trace and trace[key] is not None:
                trace[key] = _escape_values(trace[key])
    layout = fig.layout
    if layout.title is not None and layout.title.text:
        layout.title.text = plot_text(layout.title.text)
    for key in list(layout.to_plotly_json()):
        if not key.startswith(("xaxis", "yaxis")):
            continue
        axis = layout[key]
        if axis.title is not None and axis.title.text:
            axis.title.text = plot_text(axis.title.text)
        for field in _AXIS_FIELDS:
            if axis[field] is not None:
                axis[field] = _escape_values(axis[field])
    return fig


F = TypeVar("F", bound=Callable[..., Any])


def escaped_figure(builder: F) -> F:
    """Decorator for figure builders: the returned figure goes through :func:`escape_figure`."""

    @wraps(builder)
    def build(*args: Any, **kwargs: Any) -> Any:
        return escape_figure(builder(*args, **kwargs))

    return build  # type: ignore[return-value]


def terminal_text(value: Any) -> str:
    r"""``value`` for a terminal: control characters (ANSI colours, OSC 8 links, carriage
    returns, NUL) and bidirectional overrides written as visible ``\x1b``/``\u202e`` escapes;
    tabs and newlines kept.

    >>> print(terminal_text("a\x1b[31mred\rb\u202e"))
    a\x1b[31mred\x0db\u202e
    """
    return visible_text(value, keep_lines=True)


def terminal_line(value: Any) -> str:
    r"""``value`` inside one line of a terminal: as :func:`terminal_text`, and line breaks (``\n``,
    ``\r``, U+2028/U+2029) and tabs written as escapes too, so a name cannot start a line of its own
    (``x\nstep 9 · error · ...`` would forge a finding).

    >>> print(terminal_line("h.0\nstep 9 · error"))
    h.0\x0astep 9 · error
    """
    return _INVISIBLE_OR_ANY_BREAK.sub(_escape_char, "" if value is None else str(value))


def grid_text(value: Any) -> str:
    r"""``value`` for a cell of a data grid: controls, bidirectional marks and overrides (U+202A-202E,
    U+2066-2069, U+200E/F, U+061C) and line breaks as visible escapes; a grid cell shows one line, and
    an RTL override would reorder the names around it.

    >>> grid_text("evil\u202etxt.exe")
    'evil\\u202etxt.exe'
    """
    return terminal_line(value)


def grid_frame(df: Any) -> Any:
    """``df`` (a pandas DataFrame) with :func:`grid_text` applied to every text cell and every text
    column name; numbers and other cells as they are. The frame is copied only when a cell changes."""
    import pandas as pd

    def fix(v: Any) -> Any:
        return grid_text(v) if isinstance(v, str) and _INVISIBLE_OR_ANY_BREAK.search(v) else v

    out = df
    for i in range(len(df.columns)):
        series = df.iloc[:, i]
        if series.dtype == object or pd.api.types.is_string_dtype(series):
            fixed = series.map(fix)
            if not fixed.equals(series):
                out = out.copy() if out is df else out
                out.isetitem(i, fixed)
    names = [fix(c) for c in df.columns]
    if names != list(df.columns):
        out = out.copy() if out is df else out
        out.columns = names
    return out


def tensorboard_text(value: Any) -> str:
    r"""``value`` for TensorBoard's text panel (``SummaryWriter.add_text``), which renders Markdown and
    lets ``![i](http://host/p)`` become an image the viewer's browser fetches: the text, on one line
    (:func:`terminal_line`), as an indented code block, which the panel shows exactly as written.

    >>> tensorboard_text("nan at ![i](http://h/p)")
    '    nan at ![i](http://h/p)'
    """
    return "    " + terminal_line(value)
