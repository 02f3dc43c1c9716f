"""Names from a model or a file shown where they are rendered: TensorBoard's text panel (Markdown, which
shows images), the dashboard's data grids (where U+202E reorders a cell) and terminal lines (where a
line break forges a line). Each target has its escaping function in ``inspector.utils.escaping``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from inspector.integrations import TensorBoardExport, watch_accelerator
from inspector.utils import grid_frame, grid_text, tensorboard_text, terminal_line
from tests.apptest import run_page
from tests.hostile_names import IMG, KEY, LINK

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
plugin_util = pytest.importorskip("tensorboard.plugin_util")

FORGED = "x\nstep 9 · error · forged-code at h0: pwned"
RLO = "evil\u202etxt-exe"
MD_IMG = "![i](http://host/p)"  # module names hold no dots
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f"
ROOT = Path(__file__).resolve().parent.parent


def _watched(tmp_path: Path, name: str) -> Path:
    """A loop whose first module, named ``name``, gets an Inf input at step 1 (the finding names it)."""
    torch.manual_seed(0)
    model = nn.Sequential()
    model.add_module(name, nn.Linear(4, 3))
    model.add_module("head", nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    logdir = tmp_path / "tb"
    with watch_accelerator(None, model, opt, tmp_path / "run.inspect",
                           export=[TensorBoardExport(logdir=logdir)], report=None) as w:
        for i in range(3):
            x = torch.ones(2, 4)
            if i == 1:
                x[0, 0] = float("inf")
            loss = model(x).pow(2).mean()
            loss.backward()
            w.log(loss=loss)
            opt.step()
            opt.zero_grad()
    return logdir


@pytest.mark.parametrize("name", [MD_IMG, IMG, LINK, FORGED, RLO])
def test_tensorboard_shows_names_as_written_never_as_markup(tmp_path, name):
    acc = event_accumulator.EventAccumulator(str(_watched(tmp_path, name)), size_guidance={"tensors": 0})
    acc.Reload()
    texts = [bytes(e.tensor_proto.string_val[0]).decode()
             for e in acc.Tensors("inspector/findings/text_summary")]
    mine = [t for t in texts if terminal_line(name) in t]
    assert mine, texts  # the finding names the module, as written (line breaks and overrides escaped)
    for text in mine:
        html = plugin_util.markdown_to_safe_html(text)  # what the panel renders
        assert html.startswith("<pre><code>") and "<img" not in html and "<a " not in html, html
        assert "\n" not in text.strip() and "\u202e" not in text


def test_the_text_handed_to_add_text_is_an_indented_code_block():
    text = tensorboard_text(f"step 1 · error · nonfinite-output at {KEY}: {FORGED}")
    assert text.startswith("    ") and "\n" not in text
    assert plugin_util.markdown_to_safe_html(text) == (
        "<pre><code>step 1 · error · nonfinite-output at ![k](http://127.0.0.1:9/x.png): x\\x0astep 9 · "
        "error · forged-code at h0: pwned\n</code></pre>")


def test_grid_cells_show_bidi_controls_and_line_breaks_as_escapes():
    import pandas as pd

    assert grid_text(BIDI) == "".join(f"\\u{ord(c):04x}" for c in BIDI)
    frame = pd.DataFrame({"module": [RLO, FORGED, "plain"], "n": [1, 2, 3], f"col{RLO}": ["a", "b", "c"]})
    shown = grid_frame(frame)
    assert shown["module"].tolist() == ["evil\\u202etxt-exe", terminal_line(FORGED), "plain"]
    assert list(shown.columns) == ["module", "n", "col" + "evil\\u202etxt-exe"]
    assert shown["n"].tolist() == [1, 2, 3]
    assert frame["module"][0] == RLO  # the frame given is not changed
    plain = pd.DataFrame({"module": ["a"]})
    assert grid_frame(plain) is plain  # nothing to escape: no copy


NAMES = [RLO, FORGED, "\u2066isolate\u2069", "mark\u200e"]
MODEL = f'''
from torch import nn


def build():
    net = nn.Sequential()
    for name in {NAMES!r}:
        net.add_module(name, nn.Linear(2, 2))
    return net


def example_inputs(batch_size):
    import torch
    return torch.ones(batch_size, 2)
'''


def test_the_dashboards_grids_show_escapes(tmp_path, monkeypatch):
    (tmp_path / "bidi.py").write_text(MODEL, encoding="utf-8")
    monkeypatch.setenv("INSPECTOR_MODEL_DIRS", str(tmp_path))
    at = run_page("4_Hook_captures.py", f"{tmp_path}/bidi.py:build", timeout=120)
    assert not at.error, [e.value for e in at.error]
    modules = at.dataframe[0].value["module"].tolist()
    assert modules == ["evil\\u202etxt-exe", terminal_line(FORGED), "\\u2066isolate\\u2069", "mark\\u200e"]
    for df in at.dataframe:
        cells = " ".join(map(str, [*df.value.astype(str).to_numpy().ravel(), *df.value.columns]))
        assert not any(c in cells for c in BIDI + "\n"), cells


def test_a_line_break_in_a_name_forges_no_terminal_line(tmp_path, run_cli):
    folder = tmp_path / "ck\n  ERROR   forged-code: pwned"
    folder.mkdir()
    save_file({"w": torch.ones(2)}, folder / "model.safetensors")
    status, out, err = run_cli(["checkpoint", str(folder)])
    assert status == 0, err
    assert not any(line.lstrip().startswith("ERROR") for line in (out + err).splitlines()), out
    assert "ck\\x0a  ERROR   forged-code: pwned" in out  # shown, on the line of the folder's finding


def test_every_grid_of_the_pages_escapes_its_cells():
    """Each ``st.dataframe`` of the pages gets a frame through ``grid_frame`` (``show_frame`` does it for
    ``paged_table``)."""
    bare = []
    for f in sorted([*ROOT.glob("pages/*.py"), *ROOT.glob("ui/*.py")]):
        tree = ast.parse(f.read_text(encoding="utf-8"))
        for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)] + [tree]:
            escaped = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign)
                       and isinstance(n.value, ast.Call) and getattr(n.value.func, "id", "") == "grid_frame"
                       for t in n.targets if isinstance(t, ast.Name)}
            for n in ast.walk(fn):
                if isinstance(n, ast.Call) and getattr(n.func, "attr", "") == "dataframe" and n.args:
                    arg = n.args[0]
                    if not ((isinstance(arg, ast.Call) and getattr(arg.func, "id", "") == "grid_frame")
                            or (isinstance(arg, ast.Name) and arg.id in escaped)):
                        bare.append(f"{f.relative_to(ROOT)}:{n.lineno}")
    assert not bare, f"grids without grid_frame: {sorted(set(bare))}"


def test_an_error_naming_a_file_stays_one_line(tmp_path, run_cli):
    missing = tmp_path / "x\nerror: forged"
    status, out, err = run_cli(["compare", str(missing), str(missing)])
    assert status == 2 and "x\\x0aerror: forged" in err, err
    assert not any(line.startswith("error: forged") for line in err.splitlines()), err


@pytest.mark.parametrize("name", [FORGED, RLO, "\x1b[31mred", "<script>alert(1)</script>"])
def test_tensorboard_scalar_tags_carry_no_control_or_markup(tmp_path, name):
    """The per-module scalars are tagged with the module's name: escaped as in a terminal line, and
    ``<``, ``>``, ``&`` as entities (the tags once carried newlines, ANSI escapes and ``<script>``)."""
    acc = event_accumulator.EventAccumulator(str(_watched(tmp_path, name)), size_guidance={"scalars": 0})
    acc.Reload()
    mine = [t for t in acc.Tags()["scalars"] if t.startswith("inspector/grad_norm/") and "head" not in t]
    assert len(mine) == 1, acc.Tags()["scalars"]
    tag = mine[0]
    assert not any(c in tag for c in "\n\r\x1b<>\u202e"), tag
    assert tag.endswith(terminal_line(name).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;"))
