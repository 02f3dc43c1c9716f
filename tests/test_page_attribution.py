"""The Attributions page: token heatmap for tiny-gpt2, overlays and conductance bars for cnn-bn."""

from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

from ui.models import Selection

PAGE = str(Path(__file__).resolve().parent.parent / "pages" / "5_Attributions.py")


def _run(source: str | None = None) -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60)
    if source is not None:
        at.session_state["mi_selection"] = Selection(source=source)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_tiny_gpt2_token_attributions():
    at = _run()
    assert at.selectbox(key="attr_method").options == ["Integrated Gradients", "Layer Integrated Gradients"]
    assert at.number_input(key="attr_target").value == 1
    assert at.number_input(key="attr_position").value == 15
    assert len(at.get("plotly_chart")) == 1  # the token heatmap
    assert any("small enough to trust" in s.value for s in at.success)
    assert not at.error
    codes = set(at.dataframe[-1].value["code"])
    assert "method-switched" in codes

    at.number_input(key="attr_target").set_value(31).run()
    assert not at.exception and not at.error
    assert "target **31** at position **15**" in " ".join(m.value for m in at.markdown)


def test_cnn_gradcam_overlay_and_conductance_bars():
    at = _run("sample:cnn-bn")
    at.selectbox(key="attr_method").set_value("layer_gradcam").run()
    assert not at.exception and not at.error
    assert at.selectbox(key="attr_layer_layer_gradcam").value == "conv2"  # the last convolution
    assert len(at.get("plotly_chart")) == 1  # the overlay on the one example image
    assert any("no convergence delta" in i.value for i in at.info)

    at.selectbox(key="attr_layer_layer_gradcam").set_value("fc").run()
    assert not at.exception
    assert any("spatial output" in e.value for e in at.error)  # GradCAM needs a convolution's maps

    at.selectbox(key="attr_method").set_value("layer_conductance").run()
    at.multiselect(key="attr_layers").set_value(["conv2", "bn2"]).run()
    assert not at.exception and not at.error
    keys = [c.key for c in at.get("plotly_chart")]
    assert keys == ["attr_overlay_0", "attr_layer_bars"]  # conv2's conductance over the image, one bar per layer
    assert sum("small enough to trust" in s.value for s in at.success) == 1

    at.multiselect(key="attr_layers").set_value(["bn2"]).run()
    assert not at.exception and not at.error
    assert [c.key for c in at.get("plotly_chart")] == ["attr_overlay_0", "attr_unit_bars"]


def test_meta_model_explains_instead_of_running():
    at = AppTest.from_file(PAGE, default_timeout=60)
    at.query_params["model"] = "sample:llama-70b-meta"
    at.query_params["device"] = "meta"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("meta device" in i.value for i in at.info)
    assert not at.get("plotly_chart")
