"""The model tree: its data on hand-built models, its figure, and the home page's tree section."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch
from streamlit.testing.v1 import AppTest
from torch import nn

from inspector import LENSES, capture_activations, format_bytes, format_count, gradient_report, module_tree
from inspector.figures import lens_colours, module_tree_figure
from sample_models import SAMPLES

APP = str(Path(__file__).resolve().parent.parent / "app.py")


class Tied(nn.Module):
    """emb (4x3, 48 bytes) tied to head; proj (3x3 + 3 = 48 bytes) in float64 = 96 bytes; a buffer
    ``scale`` (3 float32 = 12 bytes) and ``first``, a view of it (the first element)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(4, 3)
        self.body = nn.Sequential(nn.Linear(3, 3).double(), nn.ReLU())
        self.head = nn.Linear(3, 4, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.ones(3))
        self.register_buffer("first", self.scale[:1])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(self.emb(x).double()).float() * self.scale
        return self.head(h)


@pytest.fixture(scope="module")
def tied() -> Tied:
    torch.manual_seed(0)
    return Tied()


def test_sizes_devices_dtypes_and_aliases(tied):
    t = module_tree(tied)
    m = t.modules.set_index("id")
    # model: emb 48 + body.0 96 + scale 12 + first 4 = 160; head adds nothing (its weight is emb's)
    assert m.loc["", "bytes"] == 160 and m.loc["emb", "bytes"] == 48 and m.loc["head", "bytes"] == 0
    assert m.loc["body", "bytes"] == m.loc["body.0", "bytes"] == 96 and m.loc["body.1", "bytes"] == 0
    assert m.loc["body", "dtype"] == "float64" and m.loc["", "dtype"] == "mixed"
    assert m.loc["body.1", "device"] == "none" and m.loc["emb", "device"] == "cpu"
    assert m.loc["emb", "alias_group"] == m.loc["head", "alias_group"] != "none"
    assert m.loc["", "alias_group"] == "group 2"  # the model holds scale and first: the view group
    assert list(m["parent"][1:3]) == ["", ""] and m.loc["body.0", "parent"] == "body"
    rows = t.tensors.set_index("name")
    assert (
        rows.loc["head.weight", "tied_to"] == "emb.weight"
        and rows.loc["emb.weight", "tied_to"] == "head.weight"
    )
    assert rows.loc["first", "view_of"] == "scale" and rows.loc["scale", "view_of"] == "first"
    assert not t.has_gradients and not t.has_captures
    assert t.search("LINEAR") == ["body.0", "head"] and t.search("") == list(m.index)


def test_gradient_and_capture_lenses(tied):
    x = torch.tensor([[0, 1, 2]])
    grads = dict(zip([n for n, _ in tied.named_parameters()],
                     torch.autograd.grad(tied(x).sum(), list(tied.parameters())), strict=True))
    report = gradient_report(tied, grads=grads)
    caps = capture_activations(tied, x, modules=["body"])
    t = module_tree(tied, report, captured=caps.outputs, mutated=["body.1"])
    m = t.modules.set_index("id")
    expected = math.sqrt(
        sum(float(g.double().norm()) ** 2 for n, g in grads.items() if n.startswith("body."))
    )
    assert m.loc["body", "grad_norm"] == pytest.approx(expected, rel=1e-6)
    assert math.isnan(m.loc["body.1", "grad_norm"])
    assert m.loc["body", "captured"] == "captured" and m.loc["body.1", "captured"] == "mutated after capture"
    assert m.loc["emb", "captured"] == "not captured" and t.has_gradients and t.has_captures
    badges = t.tensors.set_index("name").loc["head.weight"]
    assert badges["grad_norm"] == pytest.approx(float(grads["emb.weight"].norm()))
    for lens in LENSES:
        colours, legend = lens_colours(t, lens)
        assert len(colours) == len(t.modules) and legend
    assert len(set(lens_colours(t, "gradient norm")[0])) > 2
    with pytest.raises(ValueError, match="unknown lens"):
        lens_colours(t, "colour")


def test_inspecting_changes_nothing(tied):
    before = {n: (id(p), p.clone()) for n, p in tied.named_parameters(remove_duplicate=False)}
    module_tree(tied)
    after = dict(tied.named_parameters(remove_duplicate=False))
    assert all(id(after[n]) == i and torch.equal(after[n], v) for n, (i, v) in before.items())


def test_tree_of_a_70b_model_on_meta_stays_quick():
    model = SAMPLES["llama-70b-meta"].build()
    start = time.perf_counter()
    t = module_tree(model)
    fig = module_tree_figure(t, "dtype", focus="layers.3")
    took = time.perf_counter() - start
    assert len(t.modules) > 700 and took < 3.0, took
    assert fig.data[0].level == "/layers.3" and fig.data[0].values[0] == t.modules["bytes"].iloc[0]
    assert format_bytes(t.modules["bytes"].iloc[0]).endswith("GiB")


def test_formatters():
    assert [format_bytes(n) for n in (0, 1023, 1024, 3 * 2**20 + 2**19, 40 * 2**30)] == \
        ["0 B", "1023 B", "1.0 KiB", "3.5 MiB", "40.0 GiB"]
    assert [format_count(n) for n in (999_999, 1_000_000, 68_976_648_192, 2e12)] == \
        ["999,999", "1.0 million", "69.0 billion", "2.0 trillion"]
    assert "B" not in format_count(5e9)


def test_home_page_tree_lens_search_and_badges():
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert not at.exception and not at.error
    chart = next(c for c in at.get("plotly_chart") if "home_tree" in c.proto.id)
    tree = json.loads(chart.proto.spec)["data"][0]
    # tiny-gpt2: 4,080 float32 parameter elements (16,320 bytes) and a 16 x 16 bool causal mask (256)
    assert (tree["type"], tree["ids"][0], tree["values"][0]) == ("treemap", "/", 16576)
    assert {"/transformer", "/transformer.h.0.attn.c_attn", "/lm_head"} <= set(tree["ids"])
    at.text_input(key="home_tree_search").input("lm_head").run()
    assert at.selectbox(key="home_tree_module").options == ["lm_head"]
    assert at.selectbox(key="home_tree_module").value == "lm_head"
    # lm_head's weight is counted at transformer.wte: the tree opens at the model, lm_head outlined
    assert any("holds no bytes of its own" in c.value for c in at.caption)
    table = next(df.value for df in at.dataframe if "badges" in df.value.columns)
    assert table["name"].tolist() == ["lm_head.weight"]
    assert table["badges"].iloc[0].startswith("tied to transformer.wte.weight")
    links = [link.proto.label for link in at.get("page_link")]
    assert "tied to / view of: Alias graph" in links
    at.segmented_control(key="home_tree_lens").set_value("gradient norm").run()
    assert not at.exception
    assert any("run a backward pass on the Flatten map page" in i.value for i in at.info)
    at.text_input(key="home_tree_search").input("no such module").run()
    assert any("No module name or class contains" in w.value for w in at.warning)


def test_one_device_colours_the_tree_by_module_kind(tied):
    t = module_tree(tied)
    colours, legend = lens_colours(t, "module kind")
    kinds = t.modules["cls"].astype(str).tolist()
    assert len(set(colours)) == len(set(kinds)) > 1  # one colour per class, not all one grey
    assert all(k in legend for k in set(kinds) if len(set(kinds)) <= 12)
    at = AppTest.from_file(APP, default_timeout=120).run()  # the default model, on cpu alone
    assert at.segmented_control(key="home_tree_lens").value == "module kind"


def _click(at, monkeypatch, point: dict) -> None:
    """Run ``at`` as if the browser reported a click on the treemap box ``point`` (what Streamlit's
    chart sends for a treemap click: the box's label, id, parent and point number)."""
    from streamlit.proto.WidgetStates_pb2 import WidgetState
    from streamlit.testing.v1.element_tree import ElementTree

    chart = next(c for c in at.get("plotly_chart") if "home_tree" in c.proto.id)
    state = WidgetState(id=chart.proto.id, string_value=json.dumps(
        {"selection": {"points": [point], "point_indices": [point["pointNumber"]], "box": [], "lasso": []}}))
    plain = ElementTree.get_widget_states

    def with_click(tree):
        states = plain(tree)
        states.widgets.append(state)
        return states

    monkeypatch.setattr(ElementTree, "get_widget_states", with_click)
    at.run()
    monkeypatch.setattr(ElementTree, "get_widget_states", plain)


def test_a_click_on_a_box_picks_its_module(monkeypatch):
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.text_input(key="home_tree_search").input("wte").run()  # a search the click's module is not in
    assert "transformer.h.0.mlp" not in at.selectbox(key="home_tree_module").options
    fig = next(c for c in at.get("plotly_chart") if "home_tree" in c.proto.id)
    number = json.loads(fig.proto.spec)["data"][0]["ids"].index("/transformer.h.0.mlp")
    _click(at, monkeypatch, {"label": "mlp", "id": "/transformer.h.0.mlp", "parent": "/transformer.h.0",
                             "pointNumber": number})
    assert not at.exception
    assert at.selectbox(key="home_tree_module").value == "transformer.h.0.mlp"
    assert at.text_input(key="home_tree_search").value == ""  # emptied: it would hide the module
    table = next(df.value for df in at.dataframe if "badges" in df.value.columns)
    assert sorted(table["name"]) == ["transformer.h.0.mlp.c_fc.bias", "transformer.h.0.mlp.c_fc.weight",
                                     "transformer.h.0.mlp.c_proj.bias", "transformer.h.0.mlp.c_proj.weight"]
    fig = next(c for c in at.get("plotly_chart") if "home_tree" in c.proto.id)
    assert json.loads(fig.proto.spec)["data"][0]["level"] == "/transformer.h.0.mlp"  # zoom and picker agree
