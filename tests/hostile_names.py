"""A model whose module, parameter and buffer names, and checkpoint keys, carry Markdown and HTML
payloads; and checks that rendered Markdown or a plotly figure shows them as inert text."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

LINK = "<a href=http://evil/x>link</a>"
IMG = "<img src=x onerror=alert(1)>"
JS = "[x](javascript:alert(1))"
BUF = "![b](http://evil/b)"
KEY = "![k](http://127.0.0.1:9/x.png)"  # an unexpected checkpoint key (keys may hold dots)
PAYLOADS = (LINK, IMG, JS, BUF, KEY)

MODEL_FILE = f'''
import torch
from torch import nn

LINK, IMG, JS, BUF = {LINK!r}, {IMG!r}, {JS!r}, {BUF!r}


class Hostile(nn.Module):
    def __init__(self):
        super().__init__()
        self.add_module(LINK, nn.Linear(4, 4))
        self.add_module(IMG, nn.ReLU())
        self.add_module(JS, nn.Linear(4, 2))
        self.register_buffer(BUF, torch.zeros(2))

    def forward(self, x):
        for m in self.children():
            x = m(x)
        return x + getattr(self, BUF)


def build():
    return Hostile()


def exits():
    import sys
    sys.exit(0)


def example_inputs(batch_size):
    return torch.linspace(-1, 1, 4 * batch_size).reshape(batch_size, 4)


def loss(outputs, inputs):
    return outputs.pow(2).mean()
'''


def write_hostile_model(folder: Path) -> tuple[str, str]:
    """The model file and a checkpoint for it in ``folder``: ``(source, checkpoint path)``.

    The checkpoint leaves out one tensor (a missing-key finding) and adds ``KEY`` (an
    unexpected-key finding), so hostile names reach the findings too.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hostile.py").write_text(MODEL_FILE)
    namespace: dict[str, Any] = {}
    exec(compile(MODEL_FILE, "hostile.py", "exec"), namespace)  # noqa: S102 - our own test model
    torch.manual_seed(0)
    state = {k: v.detach().clone() for k, v in namespace["build"]().state_dict().items()
             if k != f"{JS}.bias"}
    state[KEY] = torch.ones(1)
    save_file(state, str(folder / "hostile.safetensors"))
    return f"{folder / 'hostile.py'}:build", str(folder / "hostile.safetensors")


_LIVE = ("link_open", "image", "html_inline", "html_block", "autolink")


def _walk(tokens) -> Iterator[Any]:
    for t in tokens:
        yield t
        if t.children:
            yield from _walk(t.children)


def live_markdown(text: str) -> list[str]:
    """What a CommonMark/GFM renderer would make live in ``text``: links, images, raw HTML and
    bare URLs outside code spans (GFM's autolink literals). Empty when everything is inert."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark").enable("table").enable("strikethrough")
    md.validateLink = lambda url: True  # count javascript: links as live too (renderers differ)
    found = [f"{t.type}: {t.content or t.attrs}" for t in _walk(md.parse(text)) if t.type in _LIVE]
    outside_code = re.sub(r"(`+)(?:(?!\1).)+?\1", "", text, flags=re.S)
    found += [
        f"bare url: {m.group(0)}" for m in re.finditer(r"(?<!\\)://\S*|(?<![\\\w])www\.\S*", outside_code)
    ]
    return found


_TAG = re.compile(r"<(?!/?(?:br|b|i|sup|sub|extra|span(?: style='[^'<>]*')?)>)[a-zA-Z/!]")


def live_figure_text(figure: Any) -> list[str]:
    """Strings in a plotly figure (dict or JSON) holding a tag plotly would draw, other than the
    markup the figure builders write themselves (<br>, <b>, <extra>, coloured <span>)."""
    out = []

    def visit(v: Any) -> None:
        if isinstance(v, str):
            if _TAG.search(v):
                out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                visit(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                visit(x)

    visit(figure)
    return out
