"""The Attributions page: token heatmap for tiny-gpt2, overlays and conductance bars for cnn-bn."""

from __future__ import annotations

import torch
from streamlit.testing.v1 import AppTest

from inspector import LoadedModel, load_model
from tests.apptest import run_page


def _run(source: str | None = None) -> AppTest:
    return run_page("5_Attributions.py", source)


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
    assert keys == [
        "attr_overlay_0",
        "attr_layer_bars",
    ]  # conv2's conductance over the image, one bar per layer
    assert sum("small enough to trust" in s.value for s in at.success) == 1

    at.multiselect(key="attr_layers").set_value(["bn2"]).run()
    assert not at.exception and not at.error
    assert [c.key for c in at.get("plotly_chart")] == ["attr_overlay_0", "attr_unit_bars"]


def test_meta_model_explains_instead_of_running():
    at = run_page("5_Attributions.py", query={"model": "sample:llama-70b-meta", "device": "meta"})
    assert any("meta device" in i.value for i in at.info)
    assert not at.get("plotly_chart")


def test_mid_size_model_waits_for_the_button(mid_size_model):
    at = _run(mid_size_model)
    assert not at.error
    assert any("18.0 MiB" in i.value and "waits for the button" in i.value for i in at.info)
    assert not at.get("plotly_chart") and not at.session_state["attr_asked"]
    assert "mi_analyses" not in at.session_state or not at.session_state["mi_analyses"].items
    at.number_input(key="attr_target").set_value(3).run()  # changing the settings does not compute
    assert not at.exception and not at.get("plotly_chart")

    at.button(key="attr_compute").click().run()
    assert not at.exception and not at.error
    assert "target **3**" in " ".join(m.value for m in at.markdown)
    assert len(at.session_state["attr_asked"]) == 1
    at.run()  # the result stays on later reruns
    assert not at.exception and "target **3**" in " ".join(m.value for m in at.markdown)
    assert not any("waits for the button" in i.value for i in at.info)

    at.number_input(key="attr_target").set_value(2).run()  # new settings wait for the button again
    assert not at.exception and any("waits for the button" in i.value for i in at.info)
    at.number_input(key="attr_target").set_value(3).run()  # the earlier result is still there
    assert "target **3**" in " ".join(m.value for m in at.markdown)


def _status_labels(at: AppTest) -> list[str]:
    return [e.label for e in at.get("status")]


def test_layer_ig_on_cnn_defaults_to_a_layer_that_runs_and_a_failure_ends_the_status():
    at = _run("sample:cnn-bn")
    at.selectbox(key="attr_method").set_value("layer_ig").run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    # conv1 is overwritten in place by relu1, which Layer IG cannot attribute: conv2 is the default
    assert at.selectbox(key="attr_layer_layer_ig").value == "conv2"
    assert any(label.endswith(": done") for label in _status_labels(at))
    at.selectbox(key="attr_layer_layer_ig").set_value("conv1").run()
    assert not at.exception
    assert any("relu1" in e.value for e in at.error)
    labels = _status_labels(at)
    assert any("failed" in label for label in labels) and not any("Running" in label for label in labels)


def test_token_axis_reads_the_tokenizers_text(tmp_path):
    """A model folder with a tokenizer: the heatmap's axis shows the tokens as text, not ids."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from inspector import attribute
    from inspector.figures import token_heatmap
    from ui.tokens import token_decoder

    words = ["[UNK]", "the", "cat", "sat", *(f"w{i}" for i in range(28))]  # 32 ids, tiny-gpt2's vocabulary
    fast = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
        {w: i for i, w in enumerate(words)}, unk_token="[UNK]")))
    fast.save_pretrained(tmp_path)
    loaded = load_model("sample:tiny-gpt2")
    inputs = torch.tensor([[1, 2, 3, 4]])
    result = attribute(loaded, inputs, "layer_ig", 2, position=-1, n_steps=4)
    ids_axis = token_heatmap(result).layout.xaxis
    assert list(ids_axis.ticktext) == ["0<br>1", "1<br>2", "2<br>3", "3<br>4"]
    assert token_decoder(loaded) is None  # a sample has no tokenizer
    hf_like = LoadedModel(loaded.model, "tiny", f"hf:{tmp_path}")
    text_axis = token_heatmap(result, decode=token_decoder(hf_like)).layout.xaxis
    assert list(text_axis.ticktext) == ["0<br>the", "1<br>cat", "2<br>sat", "3<br>w0"]
    assert text_axis.title.text.startswith("position / token text")


def test_stop_button_forgets_the_run():
    at = _run()
    assert at.button(key="attr_cancel").proto.label == "Stop"
    at.button(key="attr_cancel").click().run()
    assert not at.exception
    assert any(w.value.startswith("Stopped.") for w in at.warning)
    assert not at.get("plotly_chart")  # nothing of the stopped run is drawn
