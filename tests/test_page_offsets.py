"""The Flatten map page: both maps, the strip, locate, the backward button, norms, the round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

PAGE = str(Path(__file__).resolve().parent.parent / "pages" / "2_Flatten_map.py")


@pytest.fixture(autouse=True)
def fresh_models():
    """Each test starts from freshly loaded models."""
    yield
    from ui.models import cached_model

    cached_model.clear()


def _metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def _page(model: str | None = None, device: str | None = None) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    if model:
        at.query_params["model"] = model
    if device:
        at.query_params["device"] = device
    return at.run()


def _text(element) -> str:
    """An element's Markdown as it reads: names are backslash-escaped (their brackets too)."""
    return element.value.replace("\\", "")


def test_page_shows_maps_and_backward_button_fills_gradient_norms():
    at = _page()
    assert not at.exception, [e.value for e in at.exception]
    m = _metrics(at)
    # tiny-gpt2: 16 tensors, 4080 elements (the tied 512 once), all trainable, one alias
    assert (m["Tensors in parameters()"], m["Flat vector length"], m["Trainable-only length"],
            m["Frozen elements (holes)"], m["Aliases kept once"]) == ("16", "4,080", "4,080", "0", "1")
    assert m["ok"] == "0" and m["no gradient"] == "16"
    assert len(at.get("plotly_chart")) == 2
    assert any("element 0 of the 4,080-element vector is transformer.wte.weight[0, 0]" in _text(s)
               for s in at.success)
    assert (m["Vector shares memory"], m["Restored exactly"]) == ("no", "yes")
    assert "no-gradients" in set(at.dataframe[-1].value["code"])

    at.button(key="offsets_backward").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("Ran a backward pass" in s.value for s in at.success)
    m = _metrics(at)
    assert (m["ok"], m["no gradient"], m["frozen"], m["NaN / Inf"]) == ("16", "0", "0", "0")
    assert m["Whole-model norm"] != "—"
    # the gradients are this session's: the shared model's .grad stays empty
    from ui.models import Selection, get_loaded

    assert all(p.grad is None for p in get_loaded(Selection()).model.parameters())

    at.number_input(key="offsets_index").set_value(4079).run()
    assert any("transformer.ln_f.bias[15]" in _text(s) for s in at.success)
    at.number_input(key="offsets_index").set_value(4080).run()
    assert not at.exception
    assert any("out of range" in e.value for e in at.error)


def test_page_frozen_adapter_shows_the_shift():
    at = _page("sample:frozen-adapter")
    assert not at.exception, [e.value for e in at.exception]
    m = _metrics(at)
    # 12 tensors; frozen base layers 144 + 272 + 68 = 484 of 636; adapters 152
    assert (m["Flat vector length"], m["Trainable-only length"], m["Frozen elements (holes)"]) == \
        ("636", "152", "484")
    at.number_input(key="offsets_index").set_value(100).run()
    assert any("layers.0.base.weight" in s.value for s in at.success)
    assert any("frozen" in w.value for w in at.warning)
    at.radio(key="offsets_which").set_value("trainable only").run()
    assert any("layers.1.lora_B.weight[10, 0]" in _text(s) for s in at.success)
    at.button(key="offsets_backward").click().run()
    assert not at.exception, [e.value for e in at.exception]
    m = _metrics(at)
    assert (m["ok"], m["frozen"]) == ("6", "6")


def test_page_on_meta_model_has_offsets_but_no_backward():
    at = _page("sample:llama-70b-meta", "meta")
    assert not at.exception, [e.value for e in at.exception]
    length = next(m for m in at.metric if m.label == "Flat vector length")
    assert length.value == "69.0 billion" and length.proto.help == "68,976,648,192 elements"
    assert at.button(key="offsets_backward").disabled
    assert any("meta device" in i.value for i in at.info)


def test_page_buffers_toggle_adds_buffer_rows_after_parameters():
    at = _page("sample:cnn-bn")
    assert not at.exception, [e.value for e in at.exception]
    assert _metrics(at)["Flat vector length"] == "1,594"  # conv1 224 + conv2 1168 + bn2 32 + fc 170
    at.toggle(key="offsets_buffers").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    assert _metrics(at)["Flat vector length"] == "1,594"  # buffers never count as parameters
    full = next(df.value for df in at.dataframe if "kind" in df.value.columns)
    buffers = full[full["kind"] == "buffer"]
    assert buffers["name"].tolist() == ["bn2.running_mean", "bn2.running_var", "bn2.num_batches_tracked"]
    assert buffers["start"].tolist() == [1594, 1610, 1626]


def test_sessions_keep_their_own_gradients():
    """One session's backward pass is not seen by another session on the same cached model."""
    a, b = _page(), _page()
    a.button(key="offsets_backward").click().run()
    assert _metrics(a)["ok"] == "16"
    b.run()
    assert not b.exception
    m = _metrics(b)
    assert (m["ok"], m["no gradient"], m["Whole-model norm"]) == ("0", "16", "—")
    a.run()  # and a keeps its own after b ran
    assert _metrics(a)["ok"] == "16"


def test_round_trip_on_a_big_model_names_the_sidebar_not_an_argument():
    at = _page("sample:gpt2-small")
    assert not at.exception
    note = next(i.value for i in at.info if "round trip" in i.value)
    assert "124.4 million parameter elements" in note and "sidebar" in note and "max_elements" not in note
